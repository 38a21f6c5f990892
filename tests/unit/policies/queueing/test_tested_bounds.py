"""Fair share's queues jump over the jobs a round of continued cycles tested
(``queueing.tested_bounds``): every cycle decides, tests and reserves as the walk that
checks every entry does, while jobs end, arrive (ahead of tested ones too), age and
hold reservations."""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gpusched.core import events as ev
from gpusched.core.model import JobPhase
from gpusched.policies.memory import CycleMemory
from gpusched.policies.queueing import tested_bounds
from gpusched.policies.scheduler import Scheduler, SchedulerConfig
from tests.unit.core.builders import Log, make_node
from tests.unit.policies.cursor_scenarios import SETTINGS, SHAPES, deep_queue, spec

CLASSES = ("best-effort", "training", "training-high")


@st.composite
def scenarios(draw):
    nodes = draw(st.integers(1, 2))
    job = st.tuples(st.sampled_from("abc"), st.sampled_from(SHAPES), st.sampled_from(CLASSES))
    waiting = draw(st.lists(job, min_size=5, max_size=45))
    between = draw(st.lists(st.tuples(st.integers(0, 2), st.lists(job, max_size=4), st.sampled_from([0.0, 40.0])),
                            min_size=2, max_size=12))
    budget = draw(st.integers(2, 9))
    return nodes, waiting, between, budget, draw(st.integers(1, budget - 1))


def play(scenario, jump: bool) -> list:
    """Each cycle's decisions, reservations and the round's tested jobs after it."""
    nodes, waiting, between, budget, head = scenario
    log = Log(*(make_node(f"n{i}", gpus=8, cpu=64_000, mem=512_000) for i in range(nodes)))
    for i, (team, shape, cls) in enumerate(waiting):
        log.submit(f"w{i}", spec(team, shape, f"w{i}", 100.0, priority_class=cls))
    config = SchedulerConfig(queue="fair-share", max_job_test=budget, job_test_head=head,
                             aging_s=60.0, reserve_after_s=0.0, reservation_depth=2)
    scheduler, memory = Scheduler(config), CycleMemory()
    if not jump:
        memory.keys.fair_queues().jump = False   # the walk checks every entry
    seen = []
    for ends, arrivals, wait in [(0, [], 0.0)] + between:
        log.now += wait
        for job_id in [j for j, job in log.state.jobs.items() if job.phase is JobPhase.PLACED][:ends]:
            assert log(ev.JobCancelled, job_id=job_id, reason="ended").accepted
            log.stopped(job_id, code=0, signal=0)
        for team, shape, cls in arrivals:
            n = log.state.next_seq
            log.submit(f"a{n}", spec(team, shape, f"a{n}", 100.0, priority_class=cls))
        result = scheduler.schedule(log.state, log.now, memory)
        for d in result.decisions:
            assert log.place(d.job_id, *[(w.node, w.gpus) for w in d.workers]).accepted
        seen.append((sorted((d.job_id, d.workers) for d in result.decisions),
                     [r.job.job_id for r in result.reservations], sorted(memory.keys.cursor.tested)))
    return seen


@SETTINGS
@given(scenario=scenarios())
def test_the_jump_over_tested_jobs_decides_as_the_walk_over_every_entry(scenario):
    assert play(scenario, jump=True) == play(scenario, jump=False)


def test_a_continued_cycle_jumps_over_what_its_round_tested():
    """The jump is taken: a deep queue of one team, each continued cycle enters the bound
    once and moves it over the jobs tested, never walking them again."""
    passed: list[int] = []
    enter = tested_bounds.TestedBounds.enter

    def counting(self, young, team, entries, i, members, done):
        at, bound, exceptions = enter(self, young, team, entries, i, members, done)
        passed.append(at - i)
        return at, bound, exceptions
    log = Log(make_node("n0", gpus=8, cpu=64_000, mem=512_000))
    log.submit("big", spec("a", (1, 8, 0), "big"))
    for i in range(60):
        log.submit(f"b{i:03d}", spec("a", (2, 8, 0), f"b{i:03d}"))
    scheduler, memory = Scheduler(SchedulerConfig(max_job_test=10, job_test_head=2)), CycleMemory()
    tested_bounds.TestedBounds.enter = counting
    try:
        for _ in range(5):
            scheduler.schedule(log.state, log.now, memory)
    finally:
        tested_bounds.TestedBounds.enter = enter
    # Cycles 3 to 5 start past the head and jump over 8, 16, 24 tested jobs: the bound
    # kept its place from one cycle to the next.
    assert passed[-3:] == [8, 16, 24], passed


def reservations_of_three_cycles(jump: bool) -> list:
    """A job tested at the head gets a reservation, then leaves the head: the next cycle
    tests it again in its place, below the bound (an exception for that cycle)."""
    log = deep_queue(12, "fair-share")
    config = SchedulerConfig(queue="fair-share", max_job_test=4, job_test_head=1, reserve_after_s=0.0,
                             reservation_depth=2)
    scheduler, memory = Scheduler(config), CycleMemory()
    memory.keys.fair_queues().jump = jump
    reserved = [[r.job.job_id for r in scheduler.schedule(log.state, log.now, memory).reservations]]
    for job_id in ("b000", "b001"):   # the reserved leave: the next head, b002, gets a reservation
        assert log(ev.JobCancelled, job_id=job_id, reason="user").accepted
    reserved.append([r.job.job_id for r in scheduler.schedule(log.state, log.now, memory).reservations])
    log.submit("high", spec("a", (1, 2, 0), "high", priority_class="training-high"))   # takes the head
    reserved.append([r.job.job_id for r in scheduler.schedule(log.state, log.now, memory).reservations])
    return reserved


def test_a_reserved_job_out_of_the_head_is_tested_again_in_its_place():
    assert reservations_of_three_cycles(jump=True) == reservations_of_three_cycles(jump=False) == \
        [["b000", "b001"], ["b002", "b004"], ["high", "b002"]]
