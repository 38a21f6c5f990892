"""The placement indexes kept between cycles (``placement.kept_index``) against ones built
afresh from the state at each cycle's start, after random changes (placements of whole
GPUs, shares and MIG slices, ends, requeues, node loss, registrations of new and known
nodes, into another pool or with another GPU model, cordons, GPU health, the journal
overrun), and whole cycles that keep them against cycles that keep nothing."""
from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, given, settings, strategies as st

from gpusched.core import events as ev
from gpusched.core.model import JobPhase
from gpusched.policies.placement.index import FreeIndex
from gpusched.policies.placement.kept_index import KEPT
from gpusched.policies.placement.mig_index import MigIndex
from gpusched.policies.placement.topology import GangCapacities
from gpusched.policies.queueing.keys import QueueKeys
from gpusched.policies.scheduler import Scheduler, SchedulerConfig
from tests.unit.core.builders import Log, make_node, make_spec, mig, whole
from tests.unit.policies.test_kept_ends import NODES, apply_step, step as ends_step

SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])

step = st.one_of(
    ends_step,
    st.tuples(st.just("mig"), st.integers(0, 2), st.integers(0, 5), st.sampled_from(("1g", "3g")), st.integers(0, 4)),
    st.tuples(st.just("cordon"), st.integers(0, 2), st.booleans()),
    st.tuples(st.just("requeue"), st.integers(0, 30)),
    st.tuples(st.just("enroll"), st.integers(0, 4), st.sampled_from(("default", "other")),
              st.sampled_from(("H100-80GB", "L40S-48GB"))),
)

# What waits: (workers, whole GPUs, share milli, MIG profile, CPU milli).
waiting_job = st.tuples(st.integers(1, 2), st.integers(0, 3), st.sampled_from((0, 0, 300, 700)),
                        st.sampled_from(("", "", "1g", "3g")), st.sampled_from((0, 8_000, 30_000)))


def change(log: Log, s: tuple, made: list[str]) -> None:
    """``test_kept_ends.apply_step``, and a MIG slice placed, a node cordoned or uncordoned,
    a node registered (new, or known: its agent restarted) in a pool, with a GPU model."""
    if s[0] == "mig":
        _, at, gpu, profile, start = s
        job_id = f"m{len(log.state.jobs)}"
        assert log.submit(job_id, make_spec(mig=profile, cpu=0, mem=0)).accepted
        log.place(job_id, (NODES[at], mig(gpu, profile, start)))   # may not fit: then it waits
        made.append(job_id)
    elif s[0] == "place":   # as ``apply_step`` does, on GPUs not cut into MIG slices either
        _, at, gpus, limit, gang = s
        spots = []
        for name in [NODES[at], NODES[(at + 1) % len(NODES)]][:1 + gang]:
            node = log.node(name)
            free = [g.info.index for g in node.gpus if not g.used_milli and not g.mig_mask and g.healthy]
            if len(free) < gpus or not node.schedulable or node.info.pool != "default":   # enrolled elsewhere
                return
            spots.append((name, whole(*free[:gpus])))
        job_id = f"j{len(made)}"
        spec = dataclasses.replace(make_spec(workers=len(spots), gpus=gpus, cpu=0, mem=0), max_runtime_s=limit)
        assert log.submit(job_id, spec).accepted
        assert log.place(job_id, *spots).accepted
        made.append(job_id)
    elif s[0] == "requeue":   # preempted and stopped: its workers are forgotten, it waits again
        job = log.job(made[s[1] % len(made)]) if made else None
        if job is not None and job.phase in (JobPhase.PLACED, JobPhase.RUNNING):
            assert log(ev.JobPreempted, job_id=job.job_id, attempt=job.attempt, for_job="other").accepted
            log.stopped(job.job_id)
    elif s[0] == "enroll":   # refused where the node runs jobs and would change pool
        _, at, pool, model = s
        log(ev.NodeRegistered, node=make_node((*NODES, "n3", "n4")[at], gpus=6, model=model, pool=pool,
                                              cpu=64_000, mem=512_000))
    elif s[0] == "cordon":
        log(ev.NodeCordoned if s[2] else ev.NodeUncordoned, node=NODES[s[1]])
    else:
        apply_step(log, s, made)


def fresh_like(index, state):
    if isinstance(index, GangCapacities):   # the same capacities of every shape it keeps
        fresh = GangCapacities(state.nodes, index.pool)
        fresh.shapes = {res: (fresh.capacities(res), 0) for res in index.shapes}
        return fresh
    if isinstance(index, FreeIndex):
        return FreeIndex(state.nodes, index.pool, index.gpu_weight)
    return MigIndex(state.nodes, index.pool, index.profile, index.gpu_weight)


def contents(index) -> tuple:
    if isinstance(index, GangCapacities):
        return index.seq, index.rack, {res: index.capacities(res) for res in list(index.shapes)}
    buckets = [index.whole, index.share] if isinstance(index, FreeIndex) else [index.buckets]
    return index.seq, index.where, [{k: b for k, b in kind.items() if b} for kind in buckets]


def assert_kept_as_fresh(keys: QueueKeys, state) -> int:
    """Refresh the kept indexes as the next cycle's start does; each must read as one
    built afresh from the state. How many were kept."""
    kept = keys.kept.get(KEPT)
    if kept is None:
        return 0
    kept.refresh(state)
    for key, index in kept.indexes.items():
        assert contents(index) == contents(fresh_like(index, state)), key
    return len(kept.indexes)


def decided(result) -> list:
    return sorted((d.job_id, d.workers) for d in result.decisions)


def submit_waiting(log: Log, waiting: list[tuple]) -> None:
    for k, (workers, gpus, milli, profile, cpu) in enumerate(waiting):
        if profile:
            spec = make_spec("abc"[k % 3], workers=workers, mig=profile, cpu=cpu, mem=0, name=f"w{k}")
        else:
            spec = make_spec("abc"[k % 3], workers=workers, gpus=gpus if not milli else 0, milli=milli,
                             cpu=cpu, mem=0, name=f"w{k}")
        assert log.submit(f"w{k}", spec).accepted


@SETTINGS
@given(steps=st.lists(step, max_size=30), waiting=st.lists(waiting_job, min_size=1, max_size=10),
       rounds=st.integers(2, 5), apply=st.integers(0, 2), placement=st.sampled_from(("best-fit", "gpu-packing")))
def test_cycles_that_keep_indexes_decide_as_cycles_that_keep_nothing(steps, waiting, rounds, apply, placement):
    """Over several cycles with changes between them: each kept index equals a fresh one
    at the cycle's start (the last cycle's tentative bookings, holds and cordons gone),
    and the cycle decides as one that builds its indexes afresh."""
    log = Log(*(make_node(n, gpus=6, cpu=64_000, mem=512_000) for n in NODES), make_node("o0", gpus=4, pool="other"))
    made: list[str] = []
    for s in steps[:len(steps) // 2]:
        change(log, s, made)
    submit_waiting(log, waiting)
    config = SchedulerConfig(placement=placement, reserve_after_s=0.0, default_estimate_s=100.0)
    keeping, fresh, keys = Scheduler(config), Scheduler(config), QueueKeys()
    later = steps[len(steps) // 2:]
    for r in range(rounds):
        assert_kept_as_fresh(keys, log.state)
        now = log.now
        kept = keeping.schedule(log.state, now, None, keys)
        assert decided(kept) == decided(fresh.schedule(log.state, now, None, None))
        for d in kept.decisions[:apply]:   # some placed for good, the rest only tentatively
            assert log(ev.JobPlaced, job_id=d.job_id, attempt=d.attempt, workers=d.workers).accepted
        for s in later[r::rounds]:
            change(log, s, made)
    assert_kept_as_fresh(keys, log.state)


def test_a_cycles_tentative_bookings_do_not_stay_in_the_kept_index():
    """A cycle books a job tentatively; its decision is not applied: the next cycle must
    see the node free again and decide the same (a kept index that kept the booking
    would send the job elsewhere, or nowhere)."""
    log = Log(make_node("n0", gpus=2, cpu=64_000, mem=512_000), make_node("n1", gpus=4, cpu=64_000, mem=512_000))
    assert log.submit("j", make_spec(gpus=2, cpu=0, mem=0)).accepted
    keys, scheduler = QueueKeys(), Scheduler()
    first = scheduler.schedule(log.state, log.now, None, keys)
    assert [(d.job_id, d.workers[0].node) for d in first.decisions] == [("j", "n0")]
    assert assert_kept_as_fresh(keys, log.state) == 1
    again = scheduler.schedule(log.state, log.now, None, keys)
    assert decided(again) == decided(first)


def test_a_requeued_job_frees_its_node_in_the_kept_index():
    """A job preempted and requeued between cycles frees its node: the journal names the
    job, whose workers are forgotten, and the refresh looks again at the node it held."""
    log = Log(make_node("n0", gpus=2, cpu=64_000, mem=512_000), make_node("n1", gpus=4, cpu=64_000, mem=512_000))
    assert log.submit("r", make_spec(gpus=2, cpu=0, mem=0)).accepted
    assert log.place("r", ("n0", whole(0, 1))).accepted
    assert log.submit("j", make_spec(gpus=2, cpu=0, mem=0)).accepted
    keys, scheduler = QueueKeys(), Scheduler()
    first = scheduler.schedule(log.state, log.now, None, keys)
    assert [d.workers[0].node for d in first.decisions] == ["n1"]
    assert log(ev.JobPreempted, job_id="r", attempt=0, for_job="other").accepted
    log.stopped("r")
    assert log.job("r").workers == ()
    again = scheduler.schedule(log.state, log.now, None, keys)
    assert "n0" in {d.workers[0].node for d in again.decisions}   # r again, or j
    assert decided(again) == decided(Scheduler().schedule(log.state, log.now, None, None))


def test_indexes_kept_for_one_state_are_not_read_for_another():
    """The same keys offered another state (a placer's partition taken over afresh): its
    indexes are built from that state, not the last one's."""
    full, empty = (Log(make_node("n0", gpus=2, cpu=64_000, mem=512_000)) for _ in range(2))
    assert full.submit("r", make_spec(gpus=2, cpu=0, mem=0)).accepted
    assert full.place("r", ("n0", whole(0, 1))).accepted
    for log in (full, empty):
        assert log.submit("j", make_spec(gpus=2, cpu=0, mem=0)).accepted
    keys, scheduler = QueueKeys(), Scheduler()
    assert scheduler.schedule(full.state, full.now, None, keys).decisions == []
    assert [d.workers[0].node for d in scheduler.schedule(empty.state, empty.now, None, keys).decisions] == ["n0"]


def test_a_cordon_or_a_gpu_failing_refreshes_the_kept_index_instead_of_rebuilding_it():
    """A node cordoned, a GPU failing on another, a node lost: the kept indexes survive
    (the reducer journals those nodes: ``ClusterState.node_changes``) and read as fresh
    ones, those nodes out of them (breaking the refresh, e.g. skipping the journalled
    nodes, fails here); a node registered, new or known, joins them in its place."""
    log = Log(*(make_node(n, gpus=6, cpu=64_000, mem=512_000) for n in NODES))
    assert log.submit("w", make_spec(gpus=6, cpu=0, mem=0)).accepted
    keys, scheduler = QueueKeys(), Scheduler()
    scheduler.schedule(log.state, log.now, None, keys)
    kept = keys.kept[KEPT]
    indexes = dict(kept.indexes)
    assert indexes
    assert log(ev.NodeCordoned, node="n0").accepted
    assert log(ev.GpuHealthChanged, node="n1", gpu_index=2, healthy=False).accepted
    assert log(ev.NodeLost, node="n2").accepted
    assert assert_kept_as_fresh(keys, log.state) == len(indexes)
    assert kept.indexes == indexes   # the same objects
    assert all(set(index.where) == {"n1"} for index in indexes.values() if isinstance(index, FreeIndex))
    assert scheduler.schedule(log.state, log.now, None, keys).decisions == []
    assert log(ev.NodeUncordoned, node="n0").accepted
    assert [d.workers[0].node for d in scheduler.schedule(log.state, log.now, None, keys).decisions] == ["n0"]
    assert log(ev.NodeRegistered, node=make_node("n3", gpus=6, cpu=64_000, mem=512_000)).accepted
    assert log(ev.NodeRegistered, node=make_node("n2", gpus=6, cpu=64_000, mem=512_000)).accepted   # back
    indexes = dict(kept.indexes)
    assert assert_kept_as_fresh(keys, log.state) == len(indexes)
    assert kept.indexes == indexes
    free = [index for index in indexes.values() if isinstance(index, FreeIndex)]
    assert free and all({"n2", "n3"} <= set(index.where) and index.seq["n3"] == 3 for index in free)
