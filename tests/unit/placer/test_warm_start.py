"""A pool the placer takes is warmed before its first cycle (``PlacementDecider._warmed``):
a cycle whose decisions are dropped builds what cycles keep between them, off the first
cycle's clock. Hypothesis: every round decides as a placer that does not warm (the
cursor of a budget that stops cycles included); the first cycle finds the placement
indexes built; a pool taken again is warmed again."""
from __future__ import annotations

import dataclasses
import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpusched.core import events as ev
from gpusched.core.reducer import apply
from gpusched.policies.scheduler import Scheduler, SchedulerConfig
from gpusched_placer.loop import PlacementDecider
from tests.unit.core.builders import Log, make_node, make_spec
from tests.unit.policies.cursor_scenarios import end_and_arrive

SHAPES = ((1, 1, 0), (1, 2, 0), (1, 8, 0), (2, 4, 0), (1, 0, 500))   # (workers, gpus, milli)
SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def spec(team: str, shape: tuple, name: str):
    workers, gpus, milli = shape
    return dataclasses.replace(make_spec(team, workers=workers, gpus=gpus, milli=milli, cpu=0, mem=0, name=name),
                               max_runtime_s=100.0)


@st.composite
def scenarios(draw):
    """Nodes, waiting jobs, and what happens between rounds (jobs end, jobs arrive)."""
    nodes = draw(st.integers(1, 4))
    waiting = [(draw(st.sampled_from("abc")), draw(st.sampled_from(SHAPES))) for _ in range(draw(st.integers(1, 30)))]
    between = [(draw(st.integers(0, 3)), [(draw(st.sampled_from("abc")), draw(st.sampled_from(SHAPES)))
                                          for _ in range(draw(st.integers(0, 4)))])
               for _ in range(draw(st.integers(1, 5)))]
    return nodes, waiting, between


def what(event: ev.Event) -> tuple:
    """An event less its id (a placement's is random)."""
    if type(event) is ev.JobPlaced:
        return ("placed", event.job_id, event.attempt, event.workers)
    return (type(event).__name__, event.job_id, getattr(event, "reason", None))


def play(scenario, config: SchedulerConfig, warm: bool) -> list[list[tuple]]:
    """Each round's events, folded as the follower folds them."""
    nodes, waiting, between = scenario
    log = Log(*(make_node(f"n{i}", gpus=8, cpu=64_000, mem=512_000) for i in range(nodes)))
    for i, (team, shape) in enumerate(waiting):
        log.submit(f"w{i}", spec(team, shape, f"w{i}"))
    decider = PlacementDecider(Scheduler(config), "placer-test")
    if not warm:
        decider._warm = lambda memory, state, now: None
    rounds = []
    for ends, arrivals in [(0, [])] + between:
        end_and_arrive(log, ends, arrivals, spec)
        log.now += 1.0
        events = [e for e, _ in decider(0, log.state, log.now)]
        for e in events:
            outcome = apply(log.state, e)
            decider.on_event(0, 0, e, outcome, log.state)
        rounds.append(sorted(map(what, events), key=repr))
    return rounds


@SETTINGS
@given(scenario=scenarios(), queue=st.sampled_from(["fair-share", "fifo", "priority"]),
       budget=st.integers(2, 40), head=st.integers(0, 8), reservations=st.booleans(),
       placement=st.sampled_from(["best-fit", "fgd"]))
def test_a_warmed_placer_decides_as_one_that_does_not_warm(scenario, queue, budget, head, reservations, placement):
    reserve = {} if reservations else {"backfill": False, "reserve_after_s": math.inf}
    config = SchedulerConfig(queue=queue, placement=placement, max_job_test=budget, job_test_head=min(head, budget),
                             default_estimate_s=1000.0, **reserve)
    assert play(scenario, config, warm=True) == play(scenario, config, warm=False)


class Recording(Scheduler):
    """Records, at each cycle's start, whether the placement indexes were kept already."""

    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(config)
        self.kept_at_start: list[bool] = []

    def schedule(self, state, now, memory):
        self.kept_at_start.append(("free", "default") in memory.indexes.indexes)
        return super().schedule(state, now, memory)


def test_the_first_cycle_of_a_pool_taken_finds_its_indexes_built_and_a_pool_taken_again_is_warmed_again():
    log = Log(*(make_node(f"n{i}", gpus=8) for i in range(4)))
    for i in range(6):
        log.submit(f"j{i}", make_spec("t", gpus=1))
    scheduler = Recording(SchedulerConfig())
    decider = PlacementDecider(scheduler, "placer-test")
    assert decider(0, log.state, 10.0)
    # The warming cycle (a copy of the scheduler: the same list) starts cold, the first cycle warm.
    assert scheduler.kept_at_start == [False, True]
    decider.forget({0})   # the partition lost, then taken again
    assert decider(0, log.state, 11.0)
    assert scheduler.kept_at_start == [False, True, False, True]
    log.submit("late", make_spec("t", gpus=1))
    assert decider(0, log.state, 12.0)
    assert scheduler.kept_at_start == [False, True, False, True, True]   # a pool kept is not warmed again
