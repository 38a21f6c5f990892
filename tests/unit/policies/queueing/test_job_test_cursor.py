"""The carry-over cursor of the budget of jobs tested (``queueing.cursor``, Slurm's
bf_continue): a cycle that never stops on ``max_job_test`` decides as with an unlimited
budget; a job past the budget is tested, and placed, within the stated bound of cycles;
the cursor keeps its place while jobs end and arrive."""
from __future__ import annotations

import dataclasses
import math

from hypothesis import assume, given
from hypothesis import strategies as st

from gpusched.core import events as ev
from gpusched.policies.memory import CycleMemory
from gpusched.policies.queueing.cursor import JobTestCursor
from gpusched.policies.scheduler import Scheduler, SchedulerConfig
from tests.unit.core.builders import Log, make_node, make_spec
from tests.unit.policies.cursor_scenarios import (
    SETTINGS, spec, run_cycle, scenarios, end_and_arrive, deep_queue,
)

UNLIMITED = 10 ** 9


def play(scenario, config: SchedulerConfig, parking: bool) -> tuple[list, list]:
    """Each cycle's decisions, and whether the budget could stop it."""
    nodes, waiting, between = scenario
    log = Log(*(make_node(f"n{i}", gpus=8, cpu=64_000, mem=512_000) for i in range(nodes)))
    for i, (team, shape, limit) in enumerate(waiting):
        log.submit(f"w{i}", spec(team, shape, f"w{i}", limit))
    scheduler, memory = Scheduler(config), CycleMemory()
    decided, budget_may_stop = [], []
    for ends, arrivals in [(0, [])] + between:
        end_and_arrive(log, ends, arrivals)
        # Every job is ready: a cycle with fewer waiting than the budget cannot stop on it.
        budget_may_stop.append(len(log.state.pending) >= config.max_job_test)
        decided.append(run_cycle(log, scheduler, memory, parking))
    return decided, budget_may_stop


@SETTINGS
@given(scenario=scenarios(), queue=st.sampled_from(["fair-share", "fifo", "priority"]),
       budget=st.integers(1, 40), head=st.integers(0, 8), reservations=st.booleans())
def test_until_the_budget_stops_a_cycle_the_decisions_are_those_of_an_unlimited_budget(
        scenario, queue, budget, head, reservations):
    assume(head < budget)   # else there is no cursor: every cycle is the budget's
    reserve = {} if reservations else {"backfill": False, "reserve_after_s": math.inf}
    config = SchedulerConfig(queue=queue, max_job_test=budget, job_test_head=head, default_estimate_s=1000.0,
                             **reserve)
    limited, stopped = play(scenario, config, not reservations)
    unlimited, _ = play(scenario, dataclasses.replace(config, max_job_test=UNLIMITED), not reservations)
    restarting, _ = play(scenario, dataclasses.replace(config, job_test_head=budget), not reservations)
    for cycle, may_stop in enumerate(stopped):
        # The first cycle the budget may stop starts at the head, as every cycle without the cursor.
        assert limited[cycle] == (restarting if may_stop else unlimited)[cycle], f"cycle {cycle}"
        if may_stop:
            break   # the next may continue: its decisions are the cursor's


def cycles_to_place(log: Log, config: SchedulerConfig, memory: CycleMemory, limit: int, job_id: str = "deep") -> int:
    """Cycles until ``job_id`` is placed (parking aside: on a busy pool capacity changes
    every cycle, and nothing stays parked), or ``limit + 1``."""
    scheduler = Scheduler(config)
    for cycle in range(1, limit + 1):
        if job_id in {d[0] for d in run_cycle(log, scheduler, memory, False)}:
            return cycle
    return limit + 1


BUDGET, HEAD, BLOCKED = 10, 2, 40
# The bound (queueing.cursor): the first cycle takes BUDGET jobs, each later one
# BUDGET - HEAD not yet tested.
BOUND = 1 + math.ceil((BLOCKED + 1 - BUDGET) / (BUDGET - HEAD))


def test_a_job_beyond_the_budget_is_placed_within_the_bound():
    for queue in ("fifo", "fair-share"):
        config = SchedulerConfig(queue=queue, max_job_test=BUDGET, job_test_head=HEAD,
                                 backfill=False, reserve_after_s=math.inf)
        assert cycles_to_place(deep_queue(BLOCKED, queue), config, CycleMemory(), 3 * BOUND) == BOUND, queue
        # Every cycle from the head (no cursor) never gets there.
        restart = dataclasses.replace(config, job_test_head=BUDGET)
        assert cycles_to_place(deep_queue(BLOCKED, queue), restart, CycleMemory(), 3 * BOUND) > 3 * BOUND, queue


def test_the_cursor_keeps_its_place_while_jobs_end_and_arrive():
    config = SchedulerConfig(queue="priority", max_job_test=BUDGET, job_test_head=HEAD,
                             backfill=False, reserve_after_s=math.inf)
    log, memory = deep_queue(BLOCKED, "priority"), CycleMemory()
    scheduler = Scheduler(config)
    assert run_cycle(log, scheduler, memory, False) == []
    assert memory.keys.cursor.tested == {f"b{i:03d}" for i in range(BUDGET)}
    # Tested jobs leave the queue (cancelled); 5 jobs arrive ahead of the untested ones,
    # behind the head (a higher priority class, so they sort first: the head re-tests 2).
    for i in range(3):
        assert log(ev.JobCancelled, job_id=f"b{i:03d}", reason="cancelled").accepted
    for i in range(5):
        log.submit(f"new{i}", spec("a", (1, 2, 0), f"new{i}", priority_class="training-high"))
    assert run_cycle(log, scheduler, memory, False) == []
    # The head (new0, new1) tested again, then the untested in order: new2-4, b010-b014.
    assert memory.keys.cursor.tested & log.state.pending.keys() == \
        {f"b{i:03d}" for i in range(3, 15)} | {f"new{i}" for i in range(5)}
    # Untested now: b015-b039 ahead of "deep"; each continued cycle tests BUDGET - HEAD of them.
    ahead = BLOCKED - 15
    assert cycles_to_place(log, config, memory, 3 * BOUND) == math.ceil((ahead + 1) / (BUDGET - HEAD))


def test_a_continued_cycle_takes_the_head_then_the_untested_in_order():
    log = deep_queue(30, "fifo")
    cursor = JobTestCursor()
    order = [log.state.jobs[j] for j in log.state.pending]
    taken = [j.job_id for j, _ in zip(cursor.order(log.state, order, 3), range(10))]
    assert taken == [j.job_id for j in order[:10]]
    cursor.ended(log.state, True, ["b005"])   # b005 held a reservation: tested again
    taken = [j.job_id for j, _ in zip(cursor.order(log.state, order, 3), range(10))]
    assert taken == [j.job_id for j in order[:3]] + ["b005"] + [j.job_id for j in order[10:16]]
    # A nominee (``always``) is tested every cycle, wherever the order has it.
    taken = [j.job_id for j, _ in zip(cursor.order(log.state, order, 3, always={"b007"}), range(10))]
    assert taken == [j.job_id for j in order[:3]] + ["b005", "b007"] + [j.job_id for j in order[10:15]]
    cursor.ended(log.state, False, [])   # the round ends: the next starts at the head
    assert not cursor.continuing
    assert [j.job_id for j in cursor.order(log.state, order, 3)] == [j.job_id for j in order]


def test_a_job_id_back_as_another_job_is_untested():
    """Retention dropped a tested job and freed its id: the new job with that id is tested."""
    log = Log(make_node("n0", gpus=8, cpu=64_000, mem=512_000), retention_s=10.0)
    for i in range(6):
        log.submit(f"j{i}", make_spec(name=f"j{i}"), key=f"k{i}")
    cursor = JobTestCursor()
    order = [log.state.jobs[j] for j in log.state.pending]
    assert [j.job_id for j, _ in zip(cursor.order(log.state, order, 1), range(4))] == ["j0", "j1", "j2", "j3"]
    cursor.ended(log.state, True, [])
    assert log(ev.JobCancelled, job_id="j2", reason="user").accepted
    log.now += 20.0
    log.submit("other", make_spec(name="other"))   # moves the clock: "j2" is pruned
    assert "j2" not in log.state.jobs
    log.submit("j2", make_spec(name="again"), key="k2")
    order = [log.state.jobs[j] for j in log.state.pending]
    assert [j.job_id for j in cursor.order(log.state, order, 1)] == ["j0", "j4", "j5", "other", "j2"]
