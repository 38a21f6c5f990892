"""The placement indexes kept between cycles (``placement.kept_index``) against ones built
afresh from the state at each cycle's start, after random changes (placements of whole
GPUs, shares and MIG slices, ends, requeues, node loss, registrations of new and known
nodes, into another pool or with another GPU model, cordons, GPU health, the journal
overrun), and whole cycles that keep them against cycles that keep nothing."""
from __future__ import annotations

from hypothesis import given, strategies as st

from gpusched.core import events as ev
from gpusched.policies.memory import CycleMemory
from gpusched.policies.placement.index import FreeIndex
from gpusched.policies.scheduler import Scheduler, SchedulerConfig
from tests.unit.core.builders import Log, make_node, make_spec, whole
from tests.unit.policies.kept_ends_steps import NODES
from tests.unit.policies.kept_index_steps import (
    SETTINGS, step, change, fresh_like, contents, decided, submit_waiting,
)

# What waits: (workers, whole GPUs, share milli, MIG profile, CPU milli).
waiting_job = st.tuples(st.integers(1, 2), st.integers(0, 3), st.sampled_from((0, 0, 300, 700)),
                        st.sampled_from(("", "", "1g", "3g")), st.sampled_from((0, 8_000, 30_000)))


def assert_kept_as_fresh(memory: CycleMemory, state) -> int:
    """Refresh the kept indexes as the next cycle's start does; each must read as one
    built afresh from the state. How many were kept."""
    kept = memory.indexes
    kept.refresh(state)
    for key, index in kept.indexes.items():
        assert contents(index) == contents(fresh_like(index, state)), key
    return len(kept.indexes)


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
    keeping, fresh, memory = Scheduler(config), Scheduler(config), CycleMemory()
    later = steps[len(steps) // 2:]
    for r in range(rounds):
        assert_kept_as_fresh(memory, log.state)
        now = log.now
        kept = keeping.schedule(log.state, now, memory)
        assert decided(kept) == decided(fresh.schedule(log.state, now, CycleMemory()))
        for d in kept.decisions[:apply]:   # some placed for good, the rest only tentatively
            assert log(ev.JobPlaced, job_id=d.job_id, attempt=d.attempt, workers=d.workers).accepted
        for s in later[r::rounds]:
            change(log, s, made)
    assert_kept_as_fresh(memory, log.state)


def test_a_cycles_tentative_bookings_do_not_stay_in_the_kept_index():
    """A cycle books a job tentatively; its decision is not applied: the next cycle must
    see the node free again and decide the same (a kept index that kept the booking
    would send the job elsewhere, or nowhere)."""
    log = Log(make_node("n0", gpus=2, cpu=64_000, mem=512_000), make_node("n1", gpus=4, cpu=64_000, mem=512_000))
    assert log.submit("j", make_spec(gpus=2, cpu=0, mem=0)).accepted
    memory, scheduler = CycleMemory(), Scheduler()
    first = scheduler.schedule(log.state, log.now, memory)
    assert [(d.job_id, d.workers[0].node) for d in first.decisions] == [("j", "n0")]
    assert assert_kept_as_fresh(memory, log.state) == 1
    again = scheduler.schedule(log.state, log.now, memory)
    assert decided(again) == decided(first)


def test_a_requeued_job_frees_its_node_in_the_kept_index():
    """A job preempted and requeued between cycles frees its node: the journal names the
    job, whose workers are forgotten, and the refresh looks again at the node it held."""
    log = Log(make_node("n0", gpus=2, cpu=64_000, mem=512_000), make_node("n1", gpus=4, cpu=64_000, mem=512_000))
    assert log.submit("r", make_spec(gpus=2, cpu=0, mem=0)).accepted
    assert log.place("r", ("n0", whole(0, 1))).accepted
    assert log.submit("j", make_spec(gpus=2, cpu=0, mem=0)).accepted
    memory, scheduler = CycleMemory(), Scheduler()
    first = scheduler.schedule(log.state, log.now, memory)
    assert [d.workers[0].node for d in first.decisions] == ["n1"]
    assert log(ev.JobPreempted, job_id="r", attempt=0, for_job="other").accepted
    log.stopped("r")
    assert log.job("r").workers == ()
    again = scheduler.schedule(log.state, log.now, memory)
    assert "n0" in {d.workers[0].node for d in again.decisions}   # r again, or j
    assert decided(again) == decided(Scheduler().schedule(log.state, log.now, CycleMemory()))


def test_indexes_kept_for_one_state_are_not_read_for_another():
    """The same memory offered another state (a placer's partition taken over afresh): its
    indexes are built from that state, not the last one's."""
    full, empty = (Log(make_node("n0", gpus=2, cpu=64_000, mem=512_000)) for _ in range(2))
    assert full.submit("r", make_spec(gpus=2, cpu=0, mem=0)).accepted
    assert full.place("r", ("n0", whole(0, 1))).accepted
    for log in (full, empty):
        assert log.submit("j", make_spec(gpus=2, cpu=0, mem=0)).accepted
    memory, scheduler = CycleMemory(), Scheduler()
    assert scheduler.schedule(full.state, full.now, memory).decisions == []
    assert [d.workers[0].node for d in scheduler.schedule(empty.state, empty.now, memory).decisions] == ["n0"]


def test_a_cordon_or_a_gpu_failing_refreshes_the_kept_index_instead_of_rebuilding_it():
    """A node cordoned, a GPU failing on another, a node lost: the kept indexes survive
    (the reducer journals those nodes: ``ClusterState.node_changes``) and read as fresh
    ones, those nodes out of them (breaking the refresh, e.g. skipping the journalled
    nodes, fails here); a node registered, new or known, joins them in its place."""
    log = Log(*(make_node(n, gpus=6, cpu=64_000, mem=512_000) for n in NODES))
    assert log.submit("w", make_spec(gpus=6, cpu=0, mem=0)).accepted
    memory, scheduler = CycleMemory(), Scheduler()
    scheduler.schedule(log.state, log.now, memory)
    kept = memory.indexes
    indexes = dict(kept.indexes)
    assert indexes
    assert log(ev.NodeCordoned, node="n0").accepted
    assert log(ev.GpuHealthChanged, node="n1", gpu_index=2, healthy=False).accepted
    assert log(ev.NodeLost, node="n2").accepted
    assert assert_kept_as_fresh(memory, log.state) == len(indexes)
    assert kept.indexes == indexes   # the same objects
    assert all(set(index.where) == {"n1"} for index in indexes.values() if isinstance(index, FreeIndex))
    assert scheduler.schedule(log.state, log.now, memory).decisions == []
    assert log(ev.NodeUncordoned, node="n0").accepted
    assert [d.workers[0].node for d in scheduler.schedule(log.state, log.now, memory).decisions] == ["n0"]
    assert log(ev.NodeRegistered, node=make_node("n3", gpus=6, cpu=64_000, mem=512_000)).accepted
    assert log(ev.NodeRegistered, node=make_node("n2", gpus=6, cpu=64_000, mem=512_000)).accepted   # back
    indexes = dict(kept.indexes)
    assert assert_kept_as_fresh(memory, log.state) == len(indexes)
    assert kept.indexes == indexes
    free = [index for index in indexes.values() if isinstance(index, FreeIndex)]
    assert free and all({"n2", "n3"} <= set(index.where) and index.seq["n3"] == 3 for index in free)
