"""The placer's rounds around the cycle: a state moved only by pending reasons runs no new
cycle; after a cycle that placed jobs the reasons pass waits (at most REASONS_EVERY_S);
the cyclic GC is off while a round decides."""
from __future__ import annotations

import gc

from gpusched.core import events as ev
from gpusched.core.reducer import apply
from gpusched.policies.scheduler import Scheduler
from gpusched_placer.loop import REASONS_EVERY_S, PlacementDecider
from tests.unit.core.builders import Log, make_node, make_spec


class CountingScheduler(Scheduler):
    def __init__(self) -> None:
        super().__init__()
        self.cycles = 0
        self.gc_on: list[bool] = []

    def schedule(self, *args, **kwargs):
        self.cycles += 1
        self.gc_on.append(gc.isenabled())
        return super().schedule(*args, **kwargs)


def decider_on(log: Log) -> tuple[PlacementDecider, CountingScheduler]:
    scheduler = CountingScheduler()
    return PlacementDecider(scheduler, "placer-test"), scheduler


def round_(log: Log, decider: PlacementDecider, now: float) -> list[ev.Event]:
    """One proposer round, then what it wrote folded as the follower folds it (hook included)."""
    events = [e for e, _ in decider(0, log.state, now)]
    for e in events:
        outcome = apply(log.state, e)
        assert outcome.accepted
        decider.on_event(0, 0, e, outcome, log.state)
    return events


def test_pending_reasons_alone_start_no_cycle():
    log = Log(make_node("n1", gpus=4))
    for i in range(3):
        log(ev.JobSubmitted, job_id=f"big{i}", spec=make_spec(gpus=8 + i))   # never fit: a shape each
    decider, scheduler = decider_on(log)
    assert {type(e) for e in round_(log, decider, 100.0)} == {ev.JobPendingReason}
    assert scheduler.cycles == 1
    assert round_(log, decider, 100.5) == [] and scheduler.cycles == 1   # only its own reasons moved the state
    submitted = ev.JobSubmitted(event_id="s", job_id="small", spec=make_spec(gpus=1))   # anything else starts one,
    decider.on_event(0, 0, submitted, apply(log.state, submitted), log.state)          # the hook told of it too
    assert [type(e) for e in round_(log, decider, 101.0)][0] is ev.JobPlaced
    assert scheduler.cycles == 2


def test_an_idle_state_cycles_again_only_once_a_back_off_ended():
    log = Log(make_node("n1", gpus=4))
    log(ev.JobSubmitted, job_id="big", spec=make_spec(gpus=8))     # never fits: the queue is never empty
    log(ev.JobSubmitted, job_id="retry", spec=make_spec(gpus=1))
    log.state.jobs["retry"].not_before = 105.0                       # as a charged requeue leaves it
    decider, scheduler = decider_on(log)
    assert ev.JobPlaced not in {type(e) for e in round_(log, decider, 100.0)}
    assert [round_(log, decider, t) for t in (101.0, 102.0, 104.9)] == [[], [], []]
    assert scheduler.cycles == 1
    assert [e.job_id for e in round_(log, decider, 105.5) if type(e) is ev.JobPlaced] == ["retry"]
    assert scheduler.cycles == 2


class UnlistedQueue(dict):
    """A pending set that may not be walked: an idle round that scans the queue fails."""

    def __iter__(self):
        raise AssertionError("the queue was scanned")


def test_an_idle_state_scans_the_queue_for_back_offs_once_not_every_round():
    log = Log(make_node("n1", gpus=4))
    log(ev.JobSubmitted, job_id="big", spec=make_spec(gpus=8))
    log(ev.JobSubmitted, job_id="retry", spec=make_spec(gpus=6))    # does not fit either: no cycle moves the state
    log.state.jobs["retry"].not_before = 105.0
    decider, scheduler = decider_on(log)
    round_(log, decider, 100.0)
    assert round_(log, decider, 101.0) == []   # the first idle round finds the back-off's end
    pending, log.state.pending = log.state.pending, UnlistedQueue(log.state.pending)
    assert [round_(log, decider, t) for t in (102.0, 104.9)] == [[], []] and scheduler.cycles == 1
    log.state.pending = pending
    round_(log, decider, 105.5)
    assert scheduler.cycles == 2   # the back-off ended: a cycle, at the same state
    # After that cycle the back-off that started it is behind: idle rounds cycle no more.
    for t in (106.0, 107.0, 200.0):
        round_(log, decider, t)
    assert scheduler.cycles == 2


def test_a_reason_folded_without_the_hook_still_starts_a_cycle():
    log = Log(make_node("n1", gpus=4))
    log(ev.JobSubmitted, job_id="big", spec=make_spec(gpus=8))
    decider, scheduler = decider_on(log)
    for e, _ in decider(0, log.state, 100.0):
        assert apply(log.state, e).accepted   # folded, the hook not told (a catch-up, say)
    decider(0, log.state, 100.5)
    assert scheduler.cycles == 2


def test_after_a_cycle_that_placed_the_reasons_pass_waits():
    log = Log(make_node("n1", gpus=8))
    log(ev.JobSubmitted, job_id="big", spec=make_spec(gpus=16))          # never fits
    log(ev.JobSubmitted, job_id="a", spec=make_spec(gpus=1))
    decider, _ = decider_on(log)
    assert {type(e) for e in round_(log, decider, 100.0)} == {ev.JobPlaced, ev.JobPendingReason}   # the first pass
    log(ev.JobSubmitted, job_id="late", spec=make_spec(gpus=32))          # never fits: a reason owed
    log(ev.JobSubmitted, job_id="b", spec=make_spec(gpus=1))
    assert [type(e) for e in round_(log, decider, 101.0)] == [ev.JobPlaced]   # placed, the pass skipped
    log(ev.JobSubmitted, job_id="c", spec=make_spec(gpus=1))
    written = round_(log, decider, 100.0 + REASONS_EVERY_S)   # the pass is due again, placing or not
    assert [type(e) for e in written] == [ev.JobPlaced, ev.JobPendingReason] and written[1].job_id == "late"


def test_a_cycle_that_places_nothing_is_followed_by_its_pass():
    log = Log(make_node("n1", gpus=8))
    log(ev.JobSubmitted, job_id="a", spec=make_spec(gpus=1))
    decider, _ = decider_on(log)
    round_(log, decider, 100.0)
    log(ev.JobSubmitted, job_id="big", spec=make_spec(gpus=16))
    assert [e.job_id for e in round_(log, decider, 100.5)] == ["big"]


def test_the_gc_is_off_while_deciding_and_on_again_after():
    log = Log(make_node("n1", gpus=8))
    log(ev.JobSubmitted, job_id="a", spec=make_spec(gpus=1))
    decider, scheduler = decider_on(log)
    assert gc.isenabled()
    round_(log, decider, 100.0)
    # The warming cycle of a pool taken (a copy of the scheduler: the same list), then the cycle.
    assert scheduler.gc_on == [False, False] and gc.isenabled()


def test_placements_carry_distinct_ids_of_32_hex_digits():
    log = Log(make_node("n1", gpus=8), make_node("n2", gpus=8))
    for i in range(16):
        log(ev.JobSubmitted, job_id=f"j{i}", spec=make_spec(gpus=1))
    decider, _ = decider_on(log)
    ids = [e.event_id for e in round_(log, decider, 100.0) if type(e) is ev.JobPlaced]
    assert len(ids) == 16 and len(set(ids)) == 16
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)
