"""The reservation sweep over the cycle's index of ends (``reservation.ends``) makes the
same reservations as the sweep that listed every end itself (``sweep_oracle``): over a
cycle's two sweeps with placements booked before and between them, and over whole
cycles of the scheduler, decisions included."""
from __future__ import annotations

import dataclasses
from unittest.mock import patch

from hypothesis import HealthCheck, event, given, settings, strategies as st

from gpusched.core import events as ev
from gpusched.core.digest import digest
from gpusched.core.model import WorkerAssignment
from gpusched.policies.gpu_fit import fits_node, pick_gpus
from gpusched.policies.memory import CycleMemory
from gpusched.policies.reservation.backfill import ReservationHold, reserve_for_head_of_line, runtime_estimate
from gpusched.policies.reservation import stages
from gpusched.policies.reservation.ends import EndIndex
from gpusched.policies.scheduler import Scheduler, SchedulerConfig
from gpusched.policies.statement import Statement
from tests.unit.core.builders import Log, make_node, make_spec, whole
from tests.unit.policies.reservation.sweep_oracle import oracle_reserve

NOW = 60.0
RUNTIMES = (0.0, 5.0, 20.0, 40.0, 100.0)   # few values, so that ends often coincide

running_job = st.tuples(st.integers(0, 3),               # node
                        st.integers(1, 4),               # GPUs
                        st.sampled_from(RUNTIMES),       # time limit (0: none)
                        st.sampled_from(("placed", "running", "stopping")),
                        st.booleans())                   # a second worker on the next node
waiting_job = st.tuples(st.integers(1, 4), st.integers(1, 3), st.sampled_from(RUNTIMES[1:]))


def build(nodes, running, pool_default):
    log = Log(*(make_node(f"n{i}", gpus=gpus, cpu=64_000, mem=512_000) for i, gpus in enumerate(nodes)),
              make_node("o0", gpus=4, pool="other"))
    names = [f"n{i}" for i in range(len(nodes))]
    for k, (at, gpus, runtime, phase, gang) in enumerate(running):
        spots = []
        for name in (names[at % len(names)], names[(at + 1) % len(names)])[:1 + (gang and len(names) > 1)]:
            node = log.node(name)
            free = [g.info.index for g in node.gpus if not g.used_milli]
            if len(free) < gpus:
                break
            spots.append((name, whole(*free[:gpus])))
            for i in free[:gpus]:          # taken by this job's other worker, if any
                node.gpus[i].used_milli += 1
        for name, slots in spots:
            for slot in slots:
                log.node(name).gpus[slot.index].used_milli -= 1
        if len(spots) < (2 if gang and len(names) > 1 else 1):
            continue
        job_id = f"r{k}"
        spec = dataclasses.replace(make_spec(workers=len(spots), gpus=gpus, cpu=0, mem=0), max_runtime_s=runtime)
        assert log.submit(job_id, spec).accepted
        assert log.place(job_id, *spots).accepted
        if phase != "placed":
            log.start_all(job_id)
        if phase == "stopping":
            assert log(ev.JobCancelled, job_id=job_id).accepted
    if pool_default:
        assert log(ev.PoolTimeLimitsSet, pool="default", default_s=pool_default).accepted
    return log


def book_somewhere(statement, job, booked):
    """Place ``job``'s one worker where it fits now, as a cycle's decision."""
    for node in statement.state.nodes.values():
        if node.info.pool == "default" and fits_node(node, job.spec.resources):
            slots = pick_gpus(node, job.spec.resources)
            if slots is not None:
                placed = (WorkerAssignment(0, node.name, slots),)
                statement.book(job, placed)
                booked[job.job_id] = placed
                return


def cycle(log, reserve):
    """A cycle's reservation steps on ``log``'s state: a decision, a reservation, a
    decision under its hold, a second reservation with the first held as it goes."""
    state = log.state
    statement = Statement(state)
    estimate = runtime_estimate(state, 30.0)
    booked: dict = {}
    book_somewhere(statement, state.jobs["d1"], booked)
    first = reserve(statement, state.jobs["h1"], dict(booked), estimate, ())
    hold = ReservationHold(statement, first) if first else None
    if hold:
        hold.apply()
    book_somewhere(statement, state.jobs["d2"], booked)
    earlier = [(first, first.shadow_s + estimate(first.job))] if first else []
    if hold:
        hold.lift()
    second = reserve(statement, state.jobs["h2"], dict(booked), estimate, earlier)
    statement.close()
    return [(r.shadow_s, r.workers) if r else None for r in (first, second)]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=st.lists(st.integers(2, 6), min_size=1, max_size=4),
       running=st.lists(running_job, max_size=14),
       waiting=st.lists(waiting_job, min_size=4, max_size=4),
       pool_default=st.sampled_from((0.0, 25.0)))
def test_indexed_sweep_reserves_as_the_full_sweep(nodes, running, waiting, pool_default):
    log = build(nodes, running, pool_default)
    for job_id, (gpus, workers, runtime) in zip(("h1", "h2", "d1", "d2"), waiting):
        if job_id.startswith("d"):
            workers = 1
        spec = dataclasses.replace(make_spec(workers=workers, gpus=gpus, cpu=0, mem=0), max_runtime_s=runtime)
        assert log.submit(job_id, spec).accepted
    before = digest(log.state)

    indexes: list[EndIndex] = []
    at_now: dict = {}

    def shared(statement, job, booked, estimate, earlier):   # one index and memo for the cycle, as the stage keeps
        if not indexes:
            indexes.append(EndIndex(statement.state, "default", NOW, estimate))
        return reserve_for_head_of_line(statement, job, NOW, booked, estimate, earlier, indexes[0], at_now)

    def own(statement, job, booked, estimate, earlier):      # an index built by each sweep
        return reserve_for_head_of_line(statement, job, NOW, booked, estimate, earlier)

    def full(statement, job, booked, estimate, earlier):
        return oracle_reserve(statement, job, NOW, booked, estimate, earlier)

    expected = cycle(log, full)
    for r in expected:   # how often a sweep walks ends, in the statistics
        event("none" if r is None else "at now" if r[0] == NOW else "after ends")
    assert digest(log.state) == before
    for reserve in (shared, own):
        assert cycle(log, reserve) == expected
        assert digest(log.state) == before


def summary(result):
    return ([(d.job_id, d.workers, d.backfilled) for d in result.decisions],
            [(r.job.job_id, r.shadow_s, r.workers) for r in result.reservations], result.unplaced)


def two_cycles(log, config):
    """A cycle at ``NOW``, its decisions applied, then another a little later."""
    scheduler, out = Scheduler(config), []
    for now in (NOW, NOW + 7.0):
        result = scheduler.schedule(log.state, now, CycleMemory())
        out.append(summary(result))
        for d in result.decisions:
            assert log(ev.JobPlaced, job_id=d.job_id, attempt=d.attempt, workers=d.workers, time=now).accepted
    return out


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=st.lists(st.integers(2, 6), min_size=1, max_size=4),
       running=st.lists(running_job, max_size=12),
       waiting=st.lists(waiting_job, min_size=1, max_size=8),
       depth=st.integers(1, 3))
def test_cycles_decide_and_reserve_as_with_the_full_sweep(nodes, running, waiting, depth):
    config = SchedulerConfig(queue="fifo", reserve_after_s=0.0, reservation_depth=depth, default_estimate_s=30.0)
    runs = []
    for sweep in (None, oracle_reserve):
        log = build(nodes, running, 0.0)
        for k, (gpus, workers, runtime) in enumerate(waiting):
            spec = dataclasses.replace(make_spec(workers=workers, gpus=gpus, cpu=0, mem=0), max_runtime_s=runtime)
            assert log.submit(f"w{k}", spec).accepted
        if sweep is None:
            runs.append(two_cycles(log, config))
        else:   # the stage's call, its index left out
            def full(statement, job, now, booked, estimate, earlier, *_):
                return oracle_reserve(statement, job, now, booked, estimate, earlier)
            with patch.object(stages, "reserve_for_head_of_line", full):
                runs.append(two_cycles(log, config))
    event(f"reservations: {sum(len(cycle[1]) > 0 for cycle in runs[1])} cycles of 2")
    assert runs[0] == runs[1]
