"""Reservations beyond EASY: after a wait bound (per pool) whether or not backfill is on,
several at once (depth), and runtimes estimated for jobs without a time limit."""
from __future__ import annotations

import dataclasses
import math

import pytest

from gpusched.core import events as ev
from gpusched.core.digest import digest
from gpusched.policies.memory import CycleMemory
from gpusched.policies.scheduler import Scheduler, SchedulerConfig, Unplaced
from tests.unit.core.builders import make_node, whole, workers
from tests.unit.policies.backfill_clusters import Cluster, spec

# No reservation for the first blocked job at once: only the wait bound reserves.
BOUND_ONLY = {"queue": "fifo", "backfill": False, "reserve_after_s": 300.0}


def busy_cluster() -> Cluster:
    """n1 full until 1000; n2 has 4 GPUs held until 3000 and 4 free. Three 8-GPU jobs
    wait (submitted at 1): ``a`` can have n1 at 1000, ``b`` n2 at 3000."""
    c = Cluster()
    c.running("r1", "n1", whole(*range(8)), 1000, gpus=8)
    c.running("r2", "n2", whole(0, 1, 2, 3), 3000, gpus=4)
    for job_id in ("a", "b", "c"):
        c.pending(job_id, 5000, gpus=8)
    return c


def test_without_backfill_a_job_gets_a_reservation_once_it_waited_the_bound():
    c = busy_cluster()
    c.pending("long", 10_000, gpus=4)     # n2's 4 free GPUs would take it, and delay b
    young = Scheduler(SchedulerConfig(**BOUND_ONLY, reservation_depth=2))
    assert [d.job_id for d in young.cycle(c.state, 100.0, CycleMemory())] == ["long"]   # waited 99 s: no reservation
    assert young.reservations == ()
    old = Scheduler(SchedulerConfig(**BOUND_ONLY, reservation_depth=2))
    result = old.schedule(c.state, 400.0, CycleMemory())
    assert result.decisions == []
    assert [(r.job.job_id, r.shadow_s) for r in result.reservations] == [("a", 1000.0), ("b", 3000.0)]
    assert result.unplaced["long"] is Unplaced.HELD_FOR_RESERVATION


def test_the_bound_is_per_pool():
    c = Cluster()
    assert c.log(ev.NodeRegistered, node=make_node("m1", gpus=8, cpu=64_000, mem=512_000, pool="slow")).accepted
    c.running("r1", "n1", whole(*range(8)), 1000, gpus=8)
    c.running("r2", "n2", whole(*range(8)), 1000, gpus=8)
    slow_runner = dataclasses.replace(spec("r3", 1000, gpus=8), pool="slow")
    assert c.log(ev.JobSubmitted, job_id="r3", spec=slow_runner, time=0.0).accepted
    assert c.log(ev.JobPlaced, job_id="r3", attempt=0, time=0.0, workers=workers(("m1", whole(*range(8))))).accepted
    c.pending("fast-job", 5000, gpus=8)
    slow_job = dataclasses.replace(spec("slow-job", 5000, gpus=8), pool="slow")
    assert c.log(ev.JobSubmitted, job_id="slow-job", spec=slow_job, time=1.0).accepted
    config = SchedulerConfig(**{**BOUND_ONLY, "reserve_after_s": 50.0}, pool_reserve_after_s={"slow": 600.0})
    scheduler = Scheduler(config)
    scheduler.cycle(c.state, 100.0, CycleMemory())
    assert [r.job.job_id for r in scheduler.reservations] == ["fast-job"]
    scheduler.cycle(c.state, 700.0, CycleMemory())
    assert sorted(r.job.job_id for r in scheduler.reservations) == ["fast-job", "slow-job"]


def test_depth_bounds_the_reservations_and_each_protects_its_job():
    def place_long(depth: int) -> list[str]:
        c = busy_cluster()
        c.pending("long", 10_000, gpus=4)
        config = SchedulerConfig(queue="fifo", backfill=True, reserve_after_s=0.0, reservation_depth=depth)
        scheduler = Scheduler(config)
        placed = [d.job_id for d in scheduler.cycle(c.state, 100.0, CycleMemory())]
        assert len(scheduler.reservations) == depth
        return placed
    assert place_long(1) == ["long"]   # only a is protected: long takes the GPUs b waits for
    assert place_long(2) == []         # b's reservation holds n2's free GPUs
    assert place_long(3) == []


def test_a_later_reservation_waits_for_the_earlier_job_to_end():
    """One node: a gets it when r1 ends (1000), b only when a ends (1000 + 5000)."""
    c = Cluster(nodes=1)
    c.running("r1", "n1", whole(*range(8)), 1000, gpus=8)
    c.pending("a", 5000, gpus=8)
    c.pending("b", 5000, gpus=8)
    scheduler = Scheduler(SchedulerConfig(queue="fifo", reserve_after_s=0.0, reservation_depth=2))
    scheduler.cycle(c.state, 100.0, CycleMemory())
    assert [(r.job.job_id, r.shadow_s) for r in scheduler.reservations] == [("a", 1000.0), ("b", 6000.0)]


def test_a_short_job_still_backfills_before_every_reservation():
    c = busy_cluster()
    c.pending("short", 500, gpus=4)      # ends at 600, before a's 1000 and b's 3000
    scheduler = Scheduler(SchedulerConfig(queue="fifo", reserve_after_s=0.0, reservation_depth=2))
    decisions = scheduler.cycle(c.state, 100.0, CycleMemory())
    assert [(d.job_id, d.backfilled) for d in decisions] == [("short", True)]


def test_cycles_with_several_reservations_leave_the_state_as_the_log_made_it():
    c = busy_cluster()
    c.pending("short", 500, gpus=4)
    c.pending("long", 10_000, gpus=2)
    before = digest(c.state)
    Scheduler(SchedulerConfig(queue="fifo", reserve_after_s=0.0, reservation_depth=3)).cycle(c.state, 100.0, CycleMemory())
    assert digest(c.state) == before


# --- jobs without a time limit -----------------------------------------------------------
def unknown_runtime_in_the_way() -> Cluster:
    """n1 runs ``forever`` (no time limit, no pool default); a gang waits for n1."""
    c = Cluster(nodes=1)
    c.running("forever", "n1", whole(*range(4)), 0, gpus=4)
    c.pending("gang", 10_000, gpus=8)
    c.pending("small", 50_000, gpus=4)   # would take n1's other 4 GPUs for good
    return c


def test_a_job_without_a_time_limit_is_expected_to_run_the_default_estimate():
    c = unknown_runtime_in_the_way()
    easy = Scheduler(SchedulerConfig(queue="fifo", reservation_depth=1, default_estimate_s=2000.0))
    assert easy.cycle(c.state, 100.0, CycleMemory()) == []
    assert (easy.reservation.job.job_id, easy.reservation.shadow_s) == ("gang", 2000.0)
    assert Scheduler(SchedulerConfig(queue="fifo")).schedule(c.state, 100.0, CycleMemory()).reservation.shadow_s == 86_400.0


def test_the_pools_default_time_limit_comes_before_the_schedulers_estimate():
    c = unknown_runtime_in_the_way()
    assert c.log(ev.PoolTimeLimitsSet, pool="default", default_s=3000.0).accepted   # after forever's submission
    scheduler = Scheduler(SchedulerConfig(queue="fifo", default_estimate_s=2000.0))
    scheduler.cycle(c.state, 100.0, CycleMemory())
    assert scheduler.reservation.shadow_s == 3000.0


@pytest.mark.parametrize("config", [
    SchedulerConfig(reservation_depth=-1),
    SchedulerConfig(reserve_after_s=-1.0),
    SchedulerConfig(pool_reserve_after_s={"p": math.nan}),
    SchedulerConfig(default_estimate_s=0.0),
])
def test_bad_reservation_settings_are_refused(config):
    with pytest.raises(ValueError):
        Scheduler(config)
