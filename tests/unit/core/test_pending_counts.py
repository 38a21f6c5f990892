"""The reducer's count of the pending jobs by request (``ClusterState.pending_counts``),
which FGD's task mix reads instead of every pending job: after any events it equals a
count made afresh from ``pending``, and a restored snapshot's equals the state's."""
from __future__ import annotations

from hypothesis import given, strategies as st

from gpusched.core import events as ev
from gpusched.core.model import JobPhase
from gpusched.core.snapshot import snapshot_bytes, state_from_snapshot
from gpusched.core.state import ClusterState, pending_key
from gpusched.policies.placement.fgd.task_mix import raw_counts
from tests.unit.core.builders import Log, make_node, make_spec, whole
from tests.unit.policies.kept_ends_steps import NODES, SETTINGS, apply_step, step

# Requests of pending jobs: whole GPUs, shares, MIG, gangs, another pool, a model list.
REQUESTS = (
    {"gpus": 1}, {"gpus": 2, "cpu": 4000}, {"milli": 300}, {"milli": 300, "cpu": 2000},
    {"mig": "1g.10gb"}, {"workers": 2, "gpus": 1}, {"gpus": 1, "pool": "other"},
    {"gpus": 1, "models": ("A100-80GB",)},
)
pending_step = st.one_of(
    st.tuples(st.just("submit"), st.integers(0, len(REQUESTS) - 1)),
    st.tuples(st.just("place-pending"), st.integers(0, 30)),
    st.tuples(st.just("cancel-pending"), st.integers(0, 30)),
)


def fresh(state: ClusterState) -> dict:
    counts: dict = {}
    for job_id in state.pending:
        key = pending_key(state.jobs[job_id].spec)
        counts[key] = counts.get(key, 0) + 1
    return counts


def apply_pending_step(log: Log, s: tuple, submitted: list[str]) -> None:
    """A job submitted (and left pending), a pending job placed on the first node with
    room (GPUs free, of a model it takes), or a pending job cancelled."""
    kind = s[0]
    if kind == "submit":
        job_id = f"p{len(submitted)}"
        log.submit(job_id, make_spec(**REQUESTS[s[1]]))
        submitted.append(job_id)
        return
    waiting = [j for j in log.state.pending]
    if not waiting:
        return
    job = log.job(waiting[s[1] % len(waiting)])
    if kind == "cancel-pending":
        assert log(ev.JobCancelled, job_id=job.job_id).accepted
        return
    res = job.spec.resources
    if job.spec.workers != 1 or not res.gpus or job.spec.pool != "default":
        return
    for node in log.state.nodes.values():
        free = [g.info.index for g in node.gpus if not g.used_milli and g.healthy and not g.mig_mask]
        if node.schedulable and len(free) >= res.gpus and res.allows(node.model):
            assert log.place(job.job_id, (node.name, whole(*free[:res.gpus]))).accepted
            return


@SETTINGS
@given(steps=st.lists(st.one_of(step, pending_step), max_size=40))
def test_the_kept_count_always_equals_a_fresh_count(steps):
    log = Log(*(make_node(n, gpus=6, cpu=64_000, mem=512_000) for n in NODES))
    log(ev.PoolCreated, pool="other")
    made: list[str] = []
    submitted: list[str] = []
    for s in steps:
        if s[0] in ("submit", "place-pending", "cancel-pending"):
            apply_pending_step(log, s, submitted)
        else:
            apply_step(log, s, made)
        assert log.state.pending_counts == fresh(log.state)
        assert all(n > 0 for n in log.state.pending_counts.values())
    restored = state_from_snapshot(snapshot_bytes(log.state))
    assert restored.pending_counts == log.state.pending_counts


def test_a_requeued_job_counts_again_and_an_ended_one_not():
    log = Log(make_node("n0", gpus=2))
    log.submit("a", make_spec(gpus=1))
    assert log.state.pending_counts == {pending_key(log.job("a").spec): 1}
    log.place("a", ("n0", whole(0)))
    assert log.state.pending_counts == {}
    log.start_all("a")
    assert log(ev.JobPreempted, job_id="a", attempt=0, for_job="b").accepted
    log.stopped("a")
    assert log.job("a").phase is JobPhase.PENDING
    assert log.state.pending_counts == {pending_key(log.job("a").spec): 1}
    assert log(ev.JobCancelled, job_id="a").accepted
    assert log.state.pending_counts == {}


def test_a_jobs_key_is_built_once_and_kept_on_it():
    """The key is built at submission and the same object counts the job out and in
    again; a restored job, which carries none, gets it again where it is counted."""
    log = Log(make_node("n0", gpus=2))
    log.submit("a", make_spec(gpus=1))
    key = log.job("a").pending_key
    assert key == pending_key(log.job("a").spec)
    assert next(iter(log.state.pending_counts)) is key
    log.place("a", ("n0", whole(0)))
    log.start_all("a")
    assert log(ev.JobPreempted, job_id="a", attempt=0, for_job="b").accepted
    log.stopped("a")
    assert log.job("a").pending_key is key and next(iter(log.state.pending_counts)) is key
    restored = state_from_snapshot(snapshot_bytes(log.state))
    assert restored.jobs["a"].pending_key == key and restored.pending_counts == {key: 1}


def test_the_mix_reads_the_kept_count_as_it_would_count_afresh():
    """``raw_counts`` from the kept count, and where the pending jobs were set by hand (no
    count covers them) from every pending job: the same numbers either way."""
    log = Log(make_node("n0", gpus=4))
    for i, request in enumerate(REQUESTS):
        log.submit(f"j{i}", make_spec(**request))
    log.place("j0", ("n0", whole(0)))
    state = log.state
    kept = raw_counts(state, "default")
    state.pending_counts = {}
    assert raw_counts(state, "default") == kept
    assert kept[(1000, 0, 1, (), "")] == 1 + 2   # j0 on n0, the gang of two; the other pool's aside
    assert sum(kept.values()) == sum(j.spec.workers for j in state.jobs.values() if j.spec.pool == "default")
