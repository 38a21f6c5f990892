"""Skipping by shape with reservations and backfill (``_Cycle.bound_to_fail``) changes no
decision of a cycle: on random pools with running jobs of known runtimes and waiting jobs
of a few shapes and time limits, the cycle with the gate and the cycle that offers every
job place the same jobs on the same GPUs, flagged backfilled alike, and make the same
reservations."""
from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpusched.core import events as ev
from gpusched.policies import scheduler as scheduler_module
from gpusched.policies.memory import CycleMemory
from gpusched.policies.scheduler import Scheduler, SchedulerConfig
from tests.unit.core.builders import Log, make_node, make_spec, whole

SHAPES = ((1, 1, 0), (1, 2, 0), (1, 8, 0), (2, 4, 0), (1, 0, 500))   # (workers, gpus, milli)
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def pools(draw):
    log = Log(*(make_node(f"n{i}", gpus=8, cpu=64_000, mem=512_000) for i in range(draw(st.integers(1, 3)))))
    fill = Scheduler(SchedulerConfig(backfill=False, reserve_after_s=math.inf))
    for i in range(draw(st.integers(0, 12))):
        workers, gpus, milli = draw(st.sampled_from(SHAPES))
        spec = dataclasses.replace(make_spec("r", workers=workers, gpus=gpus, milli=milli, cpu=0, mem=0,
                                             name=f"r{i}"), max_runtime_s=float(draw(st.integers(10, 500))))
        log.submit(f"r{i}", spec)
    for d in fill.cycle(log.state, log.now, CycleMemory()):
        assert log.place(d.job_id, *[(w.node, w.gpus) for w in d.workers]).accepted
        log.start_all(d.job_id)
    for i in range(draw(st.integers(1, 25))):
        workers, gpus, milli = draw(st.sampled_from(SHAPES))
        limit = float(draw(st.sampled_from([0, 20, 100, 400])))
        spec = dataclasses.replace(make_spec(draw(st.sampled_from("abc")), workers=workers, gpus=gpus, milli=milli,
                                             cpu=0, mem=0, name=f"w{i}"), max_runtime_s=limit)
        assert log(ev.JobSubmitted, job_id=f"w{i}", spec=spec,
                   time=log.now + draw(st.sampled_from([0.0, 1.0, 100.0]))).accepted
    return log


def outcome(log: Log, config: SchedulerConfig, now: float) -> tuple:
    scheduler = Scheduler(config)
    result = scheduler.schedule(log.state, now, CycleMemory())
    decisions = sorted((d.job_id, d.workers, d.backfilled) for d in result.decisions)
    reservations = [(r.job.job_id, r.shadow_s, r.workers) for r in result.reservations]
    return decisions, reservations


@SETTINGS
@given(log=pools(), queue=st.sampled_from(["fair-share", "fifo", "priority"]),
       reserve_after=st.sampled_from([0.0, 50.0, math.inf]), depth=st.integers(1, 3),
       backfill=st.booleans(), later=st.sampled_from([0.0, 60.0, 300.0]))
def test_skipping_by_shape_changes_no_decision(log, queue, reserve_after, depth, backfill, later):
    config = SchedulerConfig(queue=queue, backfill=backfill, reserve_after_s=reserve_after, reservation_depth=depth,
                             default_estimate_s=1000.0)
    now = log.now + later
    with_gate = outcome(log, config, now)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(scheduler_module._Cycle, "bound_to_fail", lambda self, job, shape: False)
        every_job = outcome(log, config, now)
    assert with_gate == every_job


def test_a_job_of_a_failed_shape_is_skipped_behind_a_reservation():
    """The gate does skip: a pool held for a whole-node job, three more of that shape."""
    log = Log(make_node("n0", gpus=8, cpu=64_000, mem=512_000))
    log.submit("run", dataclasses.replace(make_spec("r", gpus=4, cpu=0, mem=0), max_runtime_s=100.0))
    assert log.place("run", ("n0", whole(0, 1, 2, 3))).accepted
    for i in range(4):
        log.submit(f"big{i}", make_spec("a", gpus=8, cpu=0, mem=0, name=f"big{i}"))
    result = Scheduler(SchedulerConfig(reserve_after_s=math.inf)).schedule(log.state, log.now, CycleMemory())
    assert [r.job.job_id for r in result.reservations] == ["big0"]
    assert result.skipped == ["big1", "big2", "big3"]   # big0's shape failed before any hold


def test_a_shape_is_known_to_fail_as_it_failed_with_or_without_the_hold():
    """``_Cycle.known_to_fail``: what failed without the hold fails with it too; what
    failed under the hold fails under it only; nothing before any failure."""
    run = object.__new__(scheduler_module._Cycle)
    run.failed = set()
    assert not run.known_to_fail("shape", held=False) and not run.known_to_fail("shape", held=True)
    run.failed.add(("shape", True))
    assert run.known_to_fail("shape", held=True) and not run.known_to_fail("shape", held=False)
    assert not run.known_to_fail("other", held=True)
    run.failed.add(("shape", False))
    assert run.known_to_fail("shape", held=False) and run.known_to_fail("shape", held=True)
