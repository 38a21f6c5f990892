"""The index of ends kept between cycles (``reservation.kept_ends``) against one built
afresh (``ends.EndIndex``) after random changes to the state, and whole cycles that keep
it (and stop once the queue is exhausted) against cycles that keep nothing."""
from __future__ import annotations

import dataclasses
import math

from hypothesis import HealthCheck, given, settings, strategies as st

from gpusched.core import events as ev
from gpusched.core.model import JobPhase
from gpusched.policies.queueing.keys import QueueKeys
from gpusched.policies.reservation.backfill import runtime_estimate
from gpusched.policies.reservation.ends import EndIndex, EndWalk
from gpusched.policies.reservation.kept_ends import KeptEnds
from gpusched.policies.scheduler import Scheduler, SchedulerConfig
from tests.unit.core.builders import Log, make_node, make_spec, whole

NODES = ("n0", "n1", "n2")
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

step = st.one_of(
    st.tuples(st.just("place"), st.integers(0, 2), st.integers(1, 3), st.sampled_from((0.0, 5.0, 30.0, 90.0)),
              st.booleans()),
    st.tuples(st.just("start"), st.integers(0, 30)),
    st.tuples(st.just("cancel"), st.integers(0, 30)),
    st.tuples(st.just("stopped"), st.integers(0, 30)),
    st.tuples(st.just("limit"), st.sampled_from((0.0, 20.0, 60.0))),
    st.tuples(st.just("wait"), st.sampled_from((1.0, 40.0))),
    st.tuples(st.just("finish"), st.integers(0, 30), st.integers(0, 1)),
    st.tuples(st.just("preempt"), st.integers(0, 30)),
    st.tuples(st.just("gpu"), st.integers(0, 2), st.integers(0, 5), st.booleans()),
    st.tuples(st.just("lost"), st.integers(0, 2)),
    st.tuples(st.just("register"), st.integers(0, 3)),
    st.just(("drop",)),
    st.just(("drop-nodes",)),
)


def apply_step(log: Log, s: tuple, made: list[str]) -> None:
    """One change to the state: a job placed (a gang on two nodes if asked), started,
    cancelled or preempted (it stops), its workers gone, one worker ended, the pool's default time
    limit, time passing, a GPU failed or back, a node lost or (re-)registered, the
    reducer's journal of changed jobs or of changed nodes overrun."""
    kind = s[0]
    if kind == "place":
        _, at, gpus, limit, gang = s
        names = [NODES[at], NODES[(at + 1) % len(NODES)]][:1 + gang]
        spots = []
        for name in names:
            node = log.node(name)
            free = [g.info.index for g in node.gpus if not g.used_milli and g.healthy]
            if len(free) < gpus or not node.schedulable:
                return
            spots.append((name, whole(*free[:gpus])))
        job_id = f"j{len(made)}"
        spec = dataclasses.replace(make_spec(workers=len(spots), gpus=gpus, cpu=0, mem=0), max_runtime_s=limit)
        assert log.submit(job_id, spec).accepted
        assert log.place(job_id, *spots).accepted
        made.append(job_id)
    elif kind in ("start", "cancel", "stopped"):
        if not made:
            return
        job = log.job(made[s[1] % len(made)])
        if kind == "start" and job.phase is JobPhase.PLACED:
            log.start_all(job.job_id)
        elif kind == "cancel" and job.phase in (JobPhase.PLACED, JobPhase.RUNNING):
            assert log(ev.JobCancelled, job_id=job.job_id).accepted
        elif kind == "stopped" and job.phase is JobPhase.STOPPING:
            log.stopped(job.job_id)
    elif kind == "limit":
        assert log(ev.PoolTimeLimitsSet, pool="default", default_s=s[1]).accepted
    elif kind == "wait":
        log.now += s[1]
    elif kind == "finish" and made:   # one worker of a job ends (a gang's other may run on)
        job = log.job(made[s[1] % len(made)])
        if job.phase is JobPhase.RUNNING and s[2] < len(job.workers):
            log.finish(job.job_id, s[2], 0)
    elif kind == "preempt" and made:   # stopped to be requeued: its workers go once it stopped
        job = log.job(made[s[1] % len(made)])
        if job.phase in (JobPhase.PLACED, JobPhase.RUNNING):
            assert log(ev.JobPreempted, job_id=job.job_id, attempt=job.attempt, for_job="other").accepted
    elif kind == "gpu":   # a GPU fails (its jobs stop) or comes back
        log(ev.GpuHealthChanged, node=NODES[s[1]], gpu_index=s[2], healthy=s[3])
    elif kind == "lost":
        log(ev.NodeLost, node=NODES[s[1]])
    elif kind == "register":   # an agent (re-)registers: a lost node comes back, or a new node
        name = (*NODES, "n3")[s[1]]
        log(ev.NodeRegistered, node=make_node(name, gpus=6, cpu=64_000, mem=512_000))
    elif kind == "drop":
        # The journal of changed jobs ran over its bound (``CHANGES_KEPT``): its entries so
        # far are dropped, as ``note_changes`` drops the older half.
        state = log.state
        dropped = len(state.changes)
        del state.changes[:dropped]
        state.changes_base += dropped
    elif kind == "drop-nodes":   # the same, of the journal of changed nodes
        state = log.state
        dropped = len(state.node_changes)
        del state.node_changes[:dropped]
        state.node_changes_base += dropped
    # ("check",): nothing changes


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
    """Over several cycles with changes between them: the scheduler with ``QueueKeys``
    (kept ends, skipping, stopping once the queue is exhausted) decides and reserves as
    the scheduler without (every job offered, the ends listed each cycle)."""
    log = Log(*(make_node(n, gpus=6, cpu=64_000, mem=512_000) for n in NODES))
    made: list[str] = []
    for s in steps[:len(steps) // 2]:
        apply_step(log, s, made)
    for k, (workers, gpus, limit) in enumerate(waiting):
        spec = dataclasses.replace(make_spec("abc"[k % 3], workers=workers, gpus=gpus, cpu=0, mem=0, name=f"w{k}"),
                                   max_runtime_s=limit)
        assert log.submit(f"w{k}", spec).accepted
    config = SchedulerConfig(reservation_depth=depth, reserve_after_s=0.0, default_estimate_s=100.0)
    keeping, fresh, keys = Scheduler(config), Scheduler(config), QueueKeys()
    later = steps[len(steps) // 2:]
    for r in range(rounds):
        now = log.now
        kept = keeping.schedule(log.state, now, None, keys)
        assert summary(kept) == summary(fresh.schedule(log.state, now, None, None))
        for d in kept.decisions[:1]:   # one placed: the queue and the ends change
            assert log(ev.JobPlaced, job_id=d.job_id, attempt=d.attempt, workers=d.workers).accepted
        for s in later[r::rounds]:
            apply_step(log, s, made)


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
    kept = Scheduler(config).schedule(log.state, log.now, None, QueueKeys())
    every = Scheduler(config).schedule(log.state, log.now, None, None)
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
