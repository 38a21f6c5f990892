"""The bound on a cycle's time (``SchedulerConfig.max_cycle_s``, Slurm's max_sched_time):
a cycle stops taking jobs once the bound passed, but never before it took
``min_job_test``; it is continued by the next through the cursor (``queueing.cursor``),
so every job is still tested within the cursor's bound; and until the bound cuts a cycle
short the decisions are those of a cycle without it."""
from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpusched.policies.memory import CycleMemory
from gpusched.policies.scheduler import Scheduler, SchedulerConfig
from tests.unit.policies.cursor_scenarios import (
    SETTINGS, deep_queue, end_and_arrive, run_cycle, scenarios, spec,
)
from tests.unit.core.builders import Log, make_node


class Ticks:
    """A clock that reads 0 up to its ``jump``-th reading, and ``late`` from there on."""

    def __init__(self, jump: int = -1, late: float = 1e9) -> None:
        self.jump, self.late, self.reads = jump, late, 0

    def __call__(self) -> float:
        self.reads += 1
        return self.late if 0 <= self.jump <= self.reads else 0.0


class Always:
    """Every reading is one second after the last: any bound passes at once."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


MIN, HEAD, BLOCKED = 5, 2, 40
CONFIG = SchedulerConfig(queue="fifo", max_job_test=1000, job_test_head=HEAD, max_cycle_s=0.5, min_job_test=MIN,
                         backfill=False, reserve_after_s=math.inf)


def taken(result) -> int:
    return len(result.decisions) + len(result.offered) + len(result.skipped)


def test_a_cycle_stops_on_the_bound_once_it_took_min_job_test_jobs():
    log = deep_queue(BLOCKED, "fifo")
    memory = CycleMemory()
    late = Scheduler(CONFIG, clock=Always()).schedule(log.state, log.now, memory)
    assert taken(late) == MIN
    assert memory.keys.cursor.tested == {f"b{i:03d}" for i in range(MIN)}   # continued by the next cycle
    # A clock that never reaches the bound: the whole queue (the job budget is 1,000).
    whole = Scheduler(CONFIG, clock=Ticks()).schedule(log.state, log.now, CycleMemory())
    assert taken(whole) == BLOCKED + 1 and [d.job_id for d in whole.decisions] == ["deep"]
    # The clock is read from the cycle's start: a bound that passes at the 3rd reading of
    # the loop (the 4th in all) stops it after MIN + 2 jobs.
    some = Scheduler(CONFIG, clock=Ticks(jump=4)).schedule(log.state, log.now, CycleMemory())
    assert taken(some) == MIN + 2


def test_every_job_is_still_tested_within_the_cursors_bound():
    # Each cycle cut at MIN jobs: the first takes MIN, each later one MIN - HEAD untested.
    bound = 1 + math.ceil((BLOCKED + 1 - MIN) / (MIN - HEAD))
    for queue in ("fifo", "fair-share"):
        config = dataclasses.replace(CONFIG, queue=queue)
        log, memory = deep_queue(BLOCKED, queue), CycleMemory()
        scheduler = Scheduler(config, clock=Always())
        for cycle in range(1, 3 * bound + 1):
            if "deep" in {d[0] for d in run_cycle(log, scheduler, memory, False)}:
                break
        assert cycle == bound, queue
        # Without the cursor (every cycle from the head) the bound would starve it.
        restart = Scheduler(dataclasses.replace(config, job_test_head=config.max_job_test), clock=Always())
        log, memory = deep_queue(BLOCKED, queue), CycleMemory()
        assert not any("deep" in {d[0] for d in run_cycle(log, restart, memory, False)} for _ in range(3 * bound))


def play(scenario, config: SchedulerConfig, clock) -> list[tuple[list, int, int]]:
    """Each cycle's decisions in the order made, with the clock's readings before and after."""
    nodes, waiting, between = scenario
    log = Log(*(make_node(f"n{i}", gpus=8, cpu=64_000, mem=512_000) for i in range(nodes)))
    for i, (team, shape, limit) in enumerate(waiting):
        log.submit(f"w{i}", spec(team, shape, f"w{i}", limit))
    scheduler, memory, cycles = Scheduler(config, clock=clock), CycleMemory(), []
    for ends, arrivals in [(0, [])] + between:
        end_and_arrive(log, ends, arrivals, spec)
        before = clock.reads
        result = scheduler.schedule(log.state, log.now, memory)
        for d in result.decisions:
            assert log.place(d.job_id, *[(w.node, w.gpus) for w in d.workers]).accepted
        cycles.append(([(d.job_id, d.workers, d.backfilled) for d in result.decisions], before, clock.reads))
    return cycles


@SETTINGS
@given(scenario=scenarios(), queue=st.sampled_from(["fair-share", "fifo", "priority"]),
       budget=st.integers(2, 40), head=st.integers(0, 8), least=st.integers(1, 40), jump=st.integers(1, 200),
       reservations=st.booleans())
def test_until_the_bound_cuts_a_cycle_the_decisions_are_those_without_it(
        scenario, queue, budget, head, least, jump, reservations):
    reserve = {} if reservations else {"backfill": False, "reserve_after_s": math.inf}
    config = SchedulerConfig(queue=queue, max_job_test=budget, job_test_head=head, default_estimate_s=1000.0,
                             max_cycle_s=1.0, min_job_test=least, **reserve)
    bounded = play(scenario, config, Ticks(jump))
    free = play(scenario, dataclasses.replace(config, max_cycle_s=math.inf), Ticks())
    for (cut, before, after), (whole, _, _) in zip(bounded, free):
        if before + 1 < jump <= after:   # the bound passed in this cycle's loop: cut short there
            assert cut == whole[:len(cut)]   # the jobs it reached decided alike, in the same order
            break
        assert cut == whole   # the bound never passed (or passed before the cycle: its deadline moves on)


def test_the_bound_is_checked_when_the_scheduler_is_built():
    for bad in ({"max_cycle_s": 0.0}, {"max_cycle_s": -1.0}, {"min_job_test": 0}, {"max_cycle_s": math.nan}):
        with pytest.raises(ValueError, match="max_cycle_s"):
            Scheduler(SchedulerConfig(**bad))
