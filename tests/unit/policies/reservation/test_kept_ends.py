"""The index of ends kept between cycles (``reservation.kept_ends``) against one built
afresh (``ends.EndIndex``) after random changes to the state, and whole cycles that keep
it (and stop once the queue is exhausted) against cycles that keep nothing."""
from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, strategies as st

from gpusched.core import events as ev
from gpusched.policies.memory import CycleMemory
from gpusched.policies.reservation.backfill import runtime_estimate
from gpusched.policies.reservation.ends import EndIndex, EndWalk
from gpusched.policies.reservation.kept_ends import KeptEnds
from gpusched.policies import scheduler as scheduler_module
from gpusched.policies.scheduler import Scheduler, SchedulerConfig
from tests.unit.core.builders import Log, make_node, make_spec, whole
from tests.unit.policies.kept_ends_steps import NODES, SETTINGS, step, apply_step


def ends(index: EndIndex, state, now: float) -> list[tuple]:
    """Every end a sweep over all nodes reads from ``index``: in time order and, within a
    time, in node order (a sweep releases and offers node by node); the ends of one node
    at one time sorted (their order does not matter to a sweep)."""
    walk = EndWalk(index, state, set(state.nodes), {}, now, lambda job: 0.0)
    read: list[tuple] = []
    while walk.next_time() < math.inf:
        t = walk.next_time()
        node, job, here = walk.pop()
        read.append((t, node, job.job_id, here))
    assert [r[:2] for r in read] == sorted(r[:2] for r in read)
    return sorted(read)


@SETTINGS
@given(steps=st.lists(step, max_size=40))
def test_the_kept_index_reads_as_one_built_afresh(steps):
    log = Log(*(make_node(n, gpus=6, cpu=64_000, mem=512_000) for n in NODES), make_node("o0", gpus=4, pool="other"))
    kept, made = KeptEnds(), []
    for s in [*steps, ("check",)]:
        apply_step(log, s, made)
        state, now = log.state, log.now
        estimate = runtime_estimate(state, 50.0)
        index = kept.current(state, "default", now, estimate, (dict(state.pool_limits), 50.0))
        assert ends(index, state, now) == ends(EndIndex(state, "default", now, estimate), state, now)


@SETTINGS
@given(steps=st.lists(step, max_size=40), unknown=st.booleans())
def test_a_first_build_reads_as_one_built_afresh(steps, unknown):
    """The index built at once on a state that many changes made (gangs on two nodes, one
    of a gang's workers ended, jobs being stopped): the build's own path, not a refresh.
    ``unknown``: every third job's runtime is not known (it never ends)."""
    log = Log(*(make_node(n, gpus=6, cpu=64_000, mem=512_000) for n in NODES), make_node("o0", gpus=4, pool="other"))
    made: list[str] = []
    for s in steps:
        apply_step(log, s, made)
    state, now = log.state, log.now
    known = runtime_estimate(state, 50.0)
    estimate = (lambda job: 0.0 if int(job.job_id[1:]) % 3 == 0 else known(job)) if unknown else known
    index = KeptEnds().current(state, "default", now, estimate, (dict(state.pool_limits), 50.0))
    assert ends(index, state, now) == ends(EndIndex(state, "default", now, estimate), state, now)


def test_an_end_that_moved_earlier_is_read_at_its_new_time():
    """A job cancelled after the index was kept ends now, not at its time limit: the
    refresh must notice (breaking it, e.g. skipping changed jobs, fails here)."""
    log = Log(make_node("n0", gpus=2, cpu=64_000, mem=512_000))
    made: list[str] = []
    apply_step(log, ("place", 0, 1, 90.0, False), made)
    apply_step(log, ("place", 0, 1, 30.0, False), made)
    kept = KeptEnds()
    setting = (dict(log.state.pool_limits), 50.0)
    estimate = runtime_estimate(log.state, 50.0)
    first = kept.current(log.state, "default", log.now, estimate, setting)
    assert [e[2] for e in ends(first, log.state, log.now)] == ["j1", "j0"]
    assert log(ev.JobCancelled, job_id="j0").accepted
    again = kept.current(log.state, "default", log.now, estimate, setting)
    assert [(e[0], e[2]) for e in ends(again, log.state, log.now)][0] == (log.now, "j0")


def summary(result) -> tuple:
    return (sorted((d.job_id, d.workers, d.backfilled) for d in result.decisions),
            [(r.job.job_id, r.shadow_s, r.workers) for r in result.reservations])


@SETTINGS
@given(steps=st.lists(step, max_size=25), waiting=st.lists(st.tuples(st.integers(1, 2), st.integers(1, 6),
                                                                     st.sampled_from((0.0, 20.0, 200.0))),
                                                           min_size=1, max_size=10),
       depth=st.integers(1, 2), rounds=st.integers(2, 4))
def test_cycles_that_keep_decide_as_cycles_that_do_not(steps, waiting, depth, rounds):
    """Over several cycles with changes between them: the scheduler with a memory kept
    across cycles (kept ends, skipping, stopping once the queue is exhausted) decides and
    reserves as one that offers every job and lists the ends each cycle."""
    log = Log(*(make_node(n, gpus=6, cpu=64_000, mem=512_000) for n in NODES))
    made: list[str] = []
    for s in steps[:len(steps) // 2]:
        apply_step(log, s, made)
    for k, (workers, gpus, limit) in enumerate(waiting):
        spec = dataclasses.replace(make_spec("abc"[k % 3], workers=workers, gpus=gpus, cpu=0, mem=0, name=f"w{k}"),
                                   max_runtime_s=limit)
        assert log.submit(f"w{k}", spec).accepted
    config = SchedulerConfig(reservation_depth=depth, reserve_after_s=0.0, default_estimate_s=100.0)
    keeping, fresh, memory = Scheduler(config), Scheduler(config), CycleMemory()
    later = steps[len(steps) // 2:]
    for r in range(rounds):
        now = log.now
        kept = keeping.schedule(log.state, now, memory)
        assert summary(kept) == summary(offering_every_job(fresh, log, now))
        for d in kept.decisions[:1]:   # one placed: the queue and the ends change
            assert log(ev.JobPlaced, job_id=d.job_id, attempt=d.attempt, workers=d.workers).accepted
        for s in later[r::rounds]:
            apply_step(log, s, made)


def offering_every_job(scheduler: Scheduler, log: Log, now: float):
    """A cycle with a new memory (the ends listed afresh) that neither skips a job of a
    failed shape nor stops once every shape failed."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(scheduler_module._Cycle, "bound_to_fail", lambda self, job, shape: False)
        mp.setattr(scheduler_module._Cycle, "exhausted", lambda self, waiting: False)
        return scheduler.schedule(log.state, now, CycleMemory())


def full_pool_with_queue(count: int) -> Log:
    """Two 2-GPU nodes full of jobs with time limits, ``count`` 2-GPU jobs waiting."""
    log = Log(*(make_node(n, gpus=2, cpu=64_000, mem=512_000) for n in NODES[:2]))
    for k, name in enumerate(NODES[:2]):
        spec = dataclasses.replace(make_spec(workers=1, gpus=2, cpu=0, mem=0), max_runtime_s=100.0 * (k + 1))
        assert log.submit(f"r{k}", spec).accepted
        assert log.place(f"r{k}", (name, whole(0, 1))).accepted
    for k in range(count):
        assert log.submit(f"w{k}", make_spec("abc"[k % 3], gpus=2, cpu=0, mem=0, name=f"w{k}")).accepted
    return log


def test_a_cycle_stops_once_every_waiting_shape_failed_and_no_reservation_is_due():
    log = full_pool_with_queue(30)
    config = SchedulerConfig(reservation_depth=2, reserve_after_s=0.0, default_estimate_s=100.0)
    kept = Scheduler(config).schedule(log.state, log.now, CycleMemory())
    every = offering_every_job(Scheduler(config), log, log.now)
    # The first two blocked jobs get the depth's two reservations (the second only
    # because the cycle went on after the shape failed), and the cycle stops there.
    assert [r.job.job_id for r in kept.reservations] == [r.job.job_id for r in every.reservations]
    assert len(kept.reservations) == 2
    assert summary(kept) == summary(every)
    assert len(kept.offered) == 2 and kept.skipped == []
    assert len(every.offered) == 30


def test_a_cordon_compares_only_what_the_journal_names(monkeypatch):
    """A node cordoned or a GPU failing lists no end differently: the refresh reads the
    journals instead of comparing every node and job (breaking it, e.g. reading a node
    change as a rebuild, fails here); a registration, new node or known, too: the node
    registered is listed (again) by itself."""
    log = Log(*(make_node(n, gpus=6, cpu=64_000, mem=512_000) for n in NODES))
    made: list[str] = []
    apply_step(log, ("place", 0, 1, 90.0, False), made)
    kept, setting, estimate = KeptEnds(), (dict(log.state.pool_limits), 50.0), runtime_estimate(log.state, 50.0)
    kept.current(log.state, "default", log.now, estimate, setting)
    compared = []
    monkeypatch.setattr(KeptEnds, "_compare_all", lambda self, *a: compared.append(a) or (set(), []))
    assert log(ev.NodeCordoned, node="n0").accepted
    assert log(ev.GpuHealthChanged, node="n1", gpu_index=0, healthy=False).accepted
    index = kept.current(log.state, "default", log.now, estimate, setting)
    assert compared == []
    assert ends(index, log.state, log.now) == ends(EndIndex(log.state, "default", log.now, estimate), log.state,
                                                   log.now)
    assert log(ev.NodeRegistered, node=make_node("n3", gpus=6, cpu=64_000, mem=512_000)).accepted
    assert log(ev.NodeRegistered, node=make_node("n0", gpus=6, cpu=64_000, mem=512_000)).accepted
    index = kept.current(log.state, "default", log.now, estimate, setting)
    assert compared == []
    assert kept.nodes["n3"][2] == frozenset() and kept.nodes["n0"][1] is log.node("n0").info
    assert ends(index, log.state, log.now) == ends(EndIndex(log.state, "default", log.now, estimate), log.state,
                                                   log.now)
