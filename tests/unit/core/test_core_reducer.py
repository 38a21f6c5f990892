"""The reducer's accept/reject rules, one event type at a time (table-driven)."""
from __future__ import annotations

import pytest

from gpusched.core import events as ev
from gpusched.core.mig import parse_profile
from gpusched.core.model import EXIT_LOST, GpuSlot, JobPhase, NodeStatus, WorkerAssignment
from gpusched.core.reducer import (
    FAULTS_TO_QUARANTINE, FENCE_MARGIN_S, RETRY_BACKOFF_BASE_S, RETRY_BACKOFF_MAX_S, apply,
)

from .builders import Log, capacity_snapshot, make_node, make_spec, mig, share, whole


def cluster() -> Log:
    """n1: 4 H100 (MIG), n2: 2 L40S, n3: 2 H100 in pool 'other', n4 cordoned, n5 lost."""
    log = Log(
        make_node("n1", 4, "H100-80GB"),
        make_node("n2", 2, "L40S-48GB"),
        make_node("n3", 2, "H100-80GB", pool="other"),
        make_node("n4", 2, "H100-80GB"),
        make_node("n5", 2, "H100-80GB"),
    )
    assert log(ev.NodeCordoned, node="n4").accepted
    assert log(ev.NodeLost, node="n5").accepted
    return log


# --- nodes --------------------------------------------------------------------------
def test_node_registered_new_node_is_ready_with_free_gpus():
    log = Log()
    out = log(ev.NodeRegistered, node=make_node("n1", 3))
    assert out.accepted
    node = log.node("n1")
    assert node.status is NodeStatus.READY
    assert [g.used_milli for g in node.gpus] == [0, 0, 0]
    assert node.free_cpu == node.info.cpu_milli


def test_node_reregistered_keeps_allocations_and_takes_new_inventory():
    log = Log(make_node("n1", 2))
    log.submit("j1")
    log.run("j1", ("n1", whole(1)))
    before = capacity_snapshot(log.state)
    out = log(ev.NodeRegistered, node=make_node("n1", 2, agent="a2"))
    assert out.accepted
    assert capacity_snapshot(log.state) == before
    assert log.node("n1").info.agent_id == "a2"
    assert log.job("j1").phase is JobPhase.RUNNING


def test_node_reregistered_keeps_cordon():
    log = Log(make_node("n1", 2))
    log(ev.NodeCordoned, node="n1")
    assert log(ev.NodeRegistered, node=make_node("n1", 2, agent="a2")).accepted
    assert log.node("n1").status is NodeStatus.CORDONED


def test_lost_node_comes_back_ready_on_register():
    log = Log(make_node("n1", 2))
    assert log(ev.NodeLost, node="n1").accepted
    assert log.node("n1").status is NodeStatus.LOST
    assert log(ev.NodeRegistered, node=make_node("n1", 2, agent="a2")).accepted
    assert log.node("n1").status is NodeStatus.READY


@pytest.mark.parametrize("count", [1, 3])
def test_node_reregistered_with_different_gpu_count_rejected(count):
    log = Log(make_node("n1", 2))
    before = capacity_snapshot(log.state)
    out = log(ev.NodeRegistered, node=make_node("n1", count, agent="a2"))
    assert not out.accepted and "GPU count" in out.reason
    assert capacity_snapshot(log.state) == before
    assert len(log.node("n1").gpus) == 2 and log.node("n1").info.agent_id == "a1"


def test_node_lost_without_a_lease_stops_its_jobs_and_holds_the_survivors_until_they_end():
    """Nothing runs under a lease on n1 (simulated runs): its worker is gone with it. The
    gang's worker on n2 still runs, so the gang keeps n2's GPU until n2 reports it gone."""
    log = Log(make_node("n1", 2), make_node("n2", 2))
    log.submit("gang", workers=2)
    log.submit("other")
    log.run("gang", ("n1", whole(0)), ("n2", whole(0)))
    log.run("other", ("n2", whole(1)))
    out = log(ev.NodeLost, node="n1")
    assert out.accepted and out.jobs == ("gang",)
    gang = log.job("gang")
    assert gang.phase is JobPhase.STOPPING and gang.attempt == 0 and gang.finished == {0: EXIT_LOST}
    assert [g.used_milli for g in log.node("n2").gpus] == [1000, 1000] and "gang" in log.node("n2").jobs
    assert "gang" not in log.state.pending
    assert log.finish("gang", 1, 143).accepted
    assert gang.phase is JobPhase.PENDING and gang.attempt == 1
    assert gang.restarts == 0 and gang.not_before == 0.0 and gang.workers == ()
    assert "gang" in log.state.pending
    assert [g.used_milli for g in log.node("n1").gpus] == [0, 0]
    assert [g.used_milli for g in log.node("n2").gpus] == [0, 1000]
    assert log.node("n1").used_cpu == 0 and "gang" not in log.node("n2").jobs
    assert log.job("other").phase is JobPhase.RUNNING
    assert log.state.usage["team-a"].gpu_milli == 1000 and log.state.usage["team-a"].jobs == 1


def test_node_lost_under_a_lease_holds_its_work_until_fenced():
    """n1's agent may be partitioned, not dead: its workers may run until its lease ran
    out and the kill deadline passed. Only a NodeFenced at or after then frees them, and
    only then can the job be placed again."""
    log = Log(make_node("n1", 2, lease=5.0, kill_wait=3.0), make_node("n2", 2))
    log.submit("gang", workers=2)
    log.run("gang", ("n1", whole(0)), ("n2", whole(0)))
    lost = log(ev.NodeLost, node="n1")
    assert lost.accepted and log.node("n1").fence_at == log.now + 8.0 + FENCE_MARGIN_S
    gang = log.job("gang")
    assert log.finish("gang", 1, 143).accepted        # n2 stopped its worker
    assert gang.phase is JobPhase.STOPPING and log.node("n1").gpus[0].used_milli == 1000
    assert log.state.usage["team-a"].gpu_milli == 2000
    early = log(ev.NodeFenced, node="n1", time=log.node("n1").fence_at - 0.5)
    assert not early.accepted and "before" in early.reason
    assert gang.phase is JobPhase.STOPPING
    assert not log.place("gang", ("n2", whole(0)), ("n2", whole(1))).accepted   # still the old attempt
    fenced = log(ev.NodeFenced, node="n1", time=log.node("n1").fence_at)
    assert fenced.accepted and fenced.jobs == ("gang",)
    assert gang.phase is JobPhase.PENDING and gang.attempt == 1 and gang.finished == {}
    assert log.node("n1").gpus[0].used_milli == 0 and "gang" not in log.node("n1").jobs
    assert log.state.usage["team-a"].gpu_milli == 0
    assert not log(ev.NodeFenced, node="n1", time=log.now + 100).accepted   # nothing left to fence


@pytest.mark.parametrize("event, node, ok", [
    (ev.NodeLost, "n1", True),
    (ev.NodeLost, "nope", False),
    (ev.NodeLost, "lost", False),          # already lost
    (ev.NodeLost, "cordoned", True),
    (ev.NodeCordoned, "n1", True),
    (ev.NodeCordoned, "cordoned", False),
    (ev.NodeCordoned, "lost", True),       # an operator may cordon a node that is down
    (ev.NodeCordoned, "nope", False),
    (ev.NodeUncordoned, "cordoned", True),
    (ev.NodeUncordoned, "n1", False),
    (ev.NodeUncordoned, "lost", False),
    (ev.NodeUncordoned, "nope", False),
])
def test_node_status_transitions(event, node, ok):
    log = Log(make_node("n1"), make_node("cordoned"), make_node("lost"))
    log(ev.NodeCordoned, node="cordoned")
    log(ev.NodeLost, node="lost")
    before = {n: s.status for n, s in log.state.nodes.items()}
    rejected = log.state.rejected
    out = log(event, node=node)
    assert out.accepted is ok, out.reason
    after = {n: s.status for n, s in log.state.nodes.items()}
    if not ok:
        assert after == before and log.state.rejected == rejected + 1
    elif (event, node) == (ev.NodeCordoned, "lost"):
        # Stays lost now, and comes back cordoned.
        assert after[node] is NodeStatus.LOST and log.node(node).cordoned
    else:
        expected = {ev.NodeLost: NodeStatus.LOST, ev.NodeCordoned: NodeStatus.CORDONED,
                    ev.NodeUncordoned: NodeStatus.READY}[event]
        assert after[node] is expected


def test_cordon_keeps_running_jobs_but_blocks_new_placements():
    log = Log(make_node("n1", 2))
    log.submit("j1")
    log.submit("j2")
    log.run("j1", ("n1", whole(0)))
    assert log(ev.NodeCordoned, node="n1").accepted
    assert log.job("j1").phase is JobPhase.RUNNING
    out = log.place("j2", ("n1", whole(1)))
    assert not out.accepted and "cordoned" in out.reason
    assert log(ev.NodeUncordoned, node="n1").accepted
    assert log.place("j2", ("n1", whole(1))).accepted


def test_unhealthy_gpu_requeues_only_the_job_using_it():
    log = Log(make_node("n1", 4))
    log.submit("on0")
    log.submit("on1", mig="3g")
    log.submit("on2", milli=500)
    log.run("on0", ("n1", whole(0)))
    log.run("on1", ("n1", mig(1, "3g", 4)))
    log.run("on2", ("n1", share(2, 500)))
    out = log(ev.GpuHealthChanged, node="n1", gpu_index=1, healthy=False, xid=79)
    assert out.accepted and out.jobs == ("on1",)
    on1 = log.job("on1")
    assert on1.phase is JobPhase.STOPPING and log.node("n1").gpus[1].mig_mask   # held until it is gone
    log.stopped("on1")
    assert on1.phase is JobPhase.PENDING and on1.attempt == 1 and on1.restarts == 0
    gpu = log.node("n1").gpus[1]
    assert not gpu.healthy and gpu.mig_mask == 0
    assert log.job("on0").phase is JobPhase.RUNNING and log.job("on2").phase is JobPhase.RUNNING
    assert log.node("n1").status is NodeStatus.READY  # one fault does not cordon
    # nothing can be placed on the unhealthy GPU
    out = log.place("on1", ("n1", mig(1, "3g", 0)))
    assert not out.accepted and "lacks" in out.reason


def test_repeated_gpu_faults_cordon_the_node():
    assert FAULTS_TO_QUARANTINE == 2
    log = Log(make_node("n1", 4))
    for i in range(FAULTS_TO_QUARANTINE):
        assert log.node("n1").status is NodeStatus.READY
        assert log(ev.GpuHealthChanged, node="n1", gpu_index=i, healthy=False).accepted
        # healing does not undo the fault count
        assert log(ev.GpuHealthChanged, node="n1", gpu_index=i, healthy=True).accepted
    node = log.node("n1")
    assert node.faults == FAULTS_TO_QUARANTINE and node.status is NodeStatus.CORDONED
    assert log(ev.NodeUncordoned, node="n1").accepted
    assert node.faults == 0 and node.status is NodeStatus.READY


@pytest.mark.parametrize("node, index, healthy, reason", [
    ("nope", 0, False, "no GPU"),
    ("n1", 2, False, "no GPU"),
    ("n1", -1, False, "no GPU"),
    ("n1", 0, True, "unchanged"),
])
def test_gpu_health_rejects(node, index, healthy, reason):
    log = Log(make_node("n1", 2))
    out = log(ev.GpuHealthChanged, node=node, gpu_index=index, healthy=healthy)
    assert not out.accepted and reason in out.reason
    assert log.node("n1").faults == 0
    assert all(g.healthy for g in log.node("n1").gpus)


# --- submissions and cancels --------------------------------------------------------
def test_job_submitted_is_pending_in_order():
    log = Log()
    for jid in ("a", "b", "c"):
        assert log.submit(jid).accepted
    assert list(log.state.pending) == ["a", "b", "c"]
    assert [log.job(j).seq for j in "abc"] == [0, 1, 2]
    assert all(log.job(j).phase is JobPhase.PENDING and log.job(j).attempt == 0 for j in "abc")


def test_duplicate_job_id_rejected_and_original_kept():
    log = Log()
    log.submit("j1", name="first")
    out = log.submit("j1", name="second")
    assert not out.accepted and "exists" in out.reason
    assert log.job("j1").spec.name == "first" and len(log.state.jobs) == 1


@pytest.mark.parametrize("first, second, ok", [
    (("team-a", "k1"), ("team-a", "k1"), False),
    (("team-a", "k1"), ("team-b", "k1"), True),    # keys are scoped by team
    (("team-a", "k1"), ("team-a", "k2"), True),
    (("team-a", ""), ("team-a", ""), True),        # no key, no dedupe
])
def test_idempotency_key_scoped_by_team(first, second, ok):
    log = Log()
    assert log.submit("j1", key=first[1], team=first[0]).accepted
    out = log.submit("j2", key=second[1], team=second[0])
    assert out.accepted is ok
    assert ("j2" in log.state.jobs) is ok
    if not ok:
        assert "j1" in out.reason


@pytest.mark.parametrize("stage", ["pending", "placed", "running", "preempting"])
def test_cancel_ends_job_and_releases(stage):
    log = Log(make_node("n1", 2))
    log.submit("j1", workers=2)
    if stage != "pending":
        assert log.place("j1", ("n1", whole(0)), ("n1", whole(1))).accepted
    if stage in ("running", "preempting"):
        log.start_all("j1")
    if stage == "preempting":
        assert log(ev.JobPreempted, job_id="j1", attempt=0, for_job="x").accepted
    out = log(ev.JobCancelled, job_id="j1", reason="user")
    assert out.accepted
    job = log.job("j1")
    if stage != "pending":
        # Slurm's COMPLETING: the workers keep their GPUs until their agent reports them gone.
        assert job.phase is JobPhase.STOPPING and job.stop_then == "cancelled"
        assert [g.used_milli for g in log.node("n1").gpus] == [1000, 1000]
        assert not log(ev.JobCancelled, job_id="j1", reason="again").accepted
        log.finish("j1", 0, 143)
        assert job.phase is JobPhase.STOPPING and log.node("n1").gpus[0].used_milli == 1000
        log.finish("j1", 1, -9)
    assert job.phase is JobPhase.CANCELLED and job.reason == "user"
    assert "j1" not in log.state.pending
    assert [g.used_milli for g in log.node("n1").gpus] == [0, 0]
    assert log.node("n1").used_cpu == 0 and not log.node("n1").jobs
    assert log.state.team_usage("team-a").gpu_milli == 0


@pytest.mark.parametrize("end", ["cancelled", "succeeded", "unknown"])
def test_cancel_rejected_for_ended_or_unknown_job(end):
    log = Log(make_node("n1", 1))
    log.submit("j1")
    if end == "cancelled":
        log(ev.JobCancelled, job_id="j1")
    elif end == "succeeded":
        log.run("j1", ("n1", whole(0)))
        log.finish("j1", 0, 0)
    phase = log.job("j1").phase
    out = log(ev.JobCancelled, job_id="j1" if end != "unknown" else "zzz")
    assert not out.accepted
    assert log.job("j1").phase is phase


# --- placements -----------------------------------------------------------------------
def _hold(log: Log, jid: str, *placements, **spec_kw) -> None:
    assert log.submit(jid, **spec_kw).accepted
    out = log.place(jid, *placements)
    assert out.accepted, out.reason


PLACEMENT_REJECTS = [
    # id, spec kwargs, setup(log), placements, attempt, reason fragment
    ("stale-attempt", {}, None, [("n1", whole(0))], 1, "stale attempt"),
    ("negative-attempt", {}, None, [("n1", whole(0))], -1, "stale attempt"),
    ("not-pending", {}, lambda l: l.place("j", ("n1", whole(0))), [("n1", whole(1))], 0, "not pending"),
    ("cancelled", {}, lambda l: l(ev.JobCancelled, job_id="j"), [("n1", whole(0))], 0, "not pending"),
    ("unknown-node", {}, None, [("n9", whole(0))], 0, "unknown node"),
    ("node-cordoned", {}, None, [("n4", whole(0))], 0, "cordoned"),
    ("node-lost", {}, None, [("n5", whole(0))], 0, "lost"),
    ("wrong-pool", {}, None, [("n3", whole(0))], 0, "not in pool"),
    ("wrong-pool-2", {"pool": "other"}, None, [("n1", whole(0))], 0, "not in pool"),
    ("disallowed-model", {"models": ("L40S-48GB",)}, None, [("n1", whole(0))], 0, "not allowed"),
    ("no-such-gpu", {}, None, [("n2", whole(2))], 0, "no GPU 2"),
    ("negative-gpu", {}, None, [("n1", whole(-1))], 0, "no GPU -1"),
    ("gpu-twice", {"gpus": 2}, None, [("n1", whole(0, 0))], 0, "listed twice"),
    ("too-few-gpus", {"gpus": 2}, None, [("n1", whole(0))], 0, "expected 2 whole GPUs"),
    ("too-many-gpus", {"gpus": 1}, None, [("n1", whole(0, 1))], 0, "expected 1 whole GPUs"),
    ("partial-whole", {"gpus": 1}, None, [("n1", share(0, 500))], 0, "expected 1 whole GPUs"),
    ("whole-taken", {}, lambda l: _hold(l, "h", ("n1", whole(0))), [("n1", whole(0))], 0, "lacks 1000 milli"),
    ("whole-on-share", {}, lambda l: _hold(l, "h", ("n1", share(0, 100)), milli=100),
     [("n1", whole(0))], 0, "lacks 1000 milli"),
    ("whole-on-mig", {}, lambda l: _hold(l, "h", ("n1", mig(0, "1g", 6)), mig="1g"),
     [("n1", whole(0))], 0, "lacks 1000 milli"),
    ("share-over", {"milli": 500}, lambda l: _hold(l, "h", ("n1", share(0, 600)), milli=600),
     [("n1", share(0, 500))], 0, "lacks 500 milli"),
    ("share-on-mig", {"milli": 100}, lambda l: _hold(l, "h", ("n1", mig(0, "1g", 0)), mig="1g"),
     [("n1", share(0, 100))], 0, "lacks 100 milli"),
    ("share-wrong-milli", {"milli": 500}, None, [("n1", share(0, 400))], 0, "expected one GPU share"),
    ("share-two-gpus", {"milli": 500}, None, [("n1", share(0, 500) + share(1, 500))], 0, "expected one GPU share"),
    ("mig-overlap", {"mig": "2g"}, lambda l: _hold(l, "h", ("n1", mig(0, "3g", 0)), mig="3g"),
     [("n1", mig(0, "2g", 2))], 0, "lacks the MIG slices"),
    ("mig-full", {"mig": "1g"}, lambda l: _hold(l, "h", ("n1", mig(0, "7g", 0)), mig="7g"),
     [("n1", mig(0, "1g", 7 - 1))], 0, "lacks the MIG slices"),
    ("mig-on-whole", {"mig": "1g"}, lambda l: _hold(l, "h", ("n1", whole(0))),
     [("n1", mig(0, "1g", 0))], 0, "lacks the MIG slices"),
    ("mig-on-share", {"mig": "1g"}, lambda l: _hold(l, "h", ("n1", share(0, 10)), milli=10),
     [("n1", mig(0, "1g", 0))], 0, "lacks the MIG slices"),
    ("mig-invalid-start", {"mig": "3g"}, None, [("n1", (GpuSlot(0, 428, "3g", 2),))],
     0, "valid start"),
    ("mig-start-past-end", {"mig": "1g"}, None, [("n1", (GpuSlot(0, 142, "1g", 7),))], 0, "valid start"),
    ("mig-wrong-profile", {"mig": "3g"}, None, [("n1", mig(0, "4g", 0))], 0, "expected one 3g slice"),
    ("mig-not-capable", {"mig": "1g"}, None, [("n2", mig(0, "1g", 0))], 0, "lacks the MIG slices"),
    ("mig-as-whole-slot", {"mig": "1g"}, None, [("n1", whole(0))], 0, "expected one 1g slice"),
    ("unhealthy-gpu", {}, lambda l: l(ev.GpuHealthChanged, node="n1", gpu_index=3, healthy=False),
     [("n1", whole(3))], 0, "lacks 1000 milli"),
    ("cpu-exhausted", {"cpu": 16_001}, None, [("n1", whole(0))], 0, "lacks CPU or memory"),
    ("mem-exhausted", {"mem": 64_001}, None, [("n1", whole(0))], 0, "lacks CPU or memory"),
    ("cpu-held", {"cpu": 9000}, lambda l: _hold(l, "h", ("n1", whole(0)), cpu=8000),
     [("n1", whole(1))], 0, "lacks CPU or memory"),
    ("gang-cpu", {"workers": 2, "cpu": 9000}, None, [("n1", whole(0)), ("n1", whole(1))], 0, "lacks CPU or memory"),
    ("gang-mem", {"workers": 2, "mem": 40_000}, None, [("n1", whole(0)), ("n1", whole(1))], 0, "lacks CPU or memory"),
    ("gang-same-gpu", {"workers": 2}, None, [("n1", whole(0)), ("n1", whole(0))], 0, "lacks 2000 milli"),
    ("gang-share-sum", {"workers": 2, "milli": 600}, None, [("n1", share(0, 600)), ("n1", share(0, 600))], 0,
     "lacks 1200 milli"),
    ("gang-mig-overlap", {"workers": 2, "mig": "3g"}, None, [("n1", mig(0, "3g", 0)), ("n1", mig(0, "3g", 0))],
     0, "given twice"),
    ("gang-missing-worker", {"workers": 2}, None, [("n1", whole(0))], 0, "expected workers 0..1"),
    ("gang-extra-worker", {"workers": 1}, None, [("n1", whole(0)), ("n1", whole(1))], 0, "expected workers 0..0"),
    ("gang-one-worker-bad", {"workers": 2}, None, [("n1", whole(0)), ("n4", whole(0))], 0, "cordoned"),
]


@pytest.mark.parametrize("spec_kw, setup, placements, attempt, reason",
                         [c[1:] for c in PLACEMENT_REJECTS], ids=[c[0] for c in PLACEMENT_REJECTS])
def test_job_placed_rejected(spec_kw, setup, placements, attempt, reason):
    log = cluster()
    log.submit("j", **spec_kw)
    if setup:
        setup(log)
    job = log.job("j")
    phase, before, rejected = job.phase, capacity_snapshot(log.state), log.state.rejected
    out = log.place("j", *placements, attempt=attempt)
    assert not out.accepted
    assert reason in out.reason
    assert out.jobs == ("j",)
    assert log.state.rejected == rejected + 1
    assert capacity_snapshot(log.state) == before
    assert job.phase is phase


def test_job_placed_numbering_must_be_contiguous():
    log = cluster()
    log.submit("j", workers=2)
    for numbers in ((0, 2), (1, 1), (1, 2), (0, 0)):
        wa = tuple(WorkerAssignment(n, "n1", whole(i)) for i, n in enumerate(numbers))
        out = log(ev.JobPlaced, job_id="j", attempt=0, workers=wa)
        assert not out.accepted and "expected workers 0..1" in out.reason
    wa = (WorkerAssignment(1, "n1", whole(1)), WorkerAssignment(0, "n1", whole(0)))  # any order is fine
    assert log(ev.JobPlaced, job_id="j", attempt=0, workers=wa).accepted


def test_job_placed_unknown_job_rejected():
    log = cluster()
    out = log(ev.JobPlaced, job_id="ghost", attempt=0, workers=())
    assert not out.accepted and "not pending" in out.reason
    assert "ghost" not in log.state.jobs


PLACEMENT_ACCEPTS = [
    ("whole", {"gpus": 2}, [("n1", whole(2, 0))]),
    ("share", {"milli": 1000}, [("n1", share(0, 1000))]),
    ("gang-two-nodes", {"workers": 2, "gpus": 2}, [("n1", whole(0, 1)), ("n2", whole(0, 1))]),
    ("gang-share-same-gpu", {"workers": 2, "milli": 500}, [("n1", share(0, 500)), ("n1", share(0, 500))]),
    ("gang-mig-same-gpu", {"workers": 2, "mig": "3g"}, [("n1", mig(0, "3g", 0)), ("n1", mig(0, "3g", 4))]),
    ("mig-7g", {"mig": "7g"}, [("n1", mig(3, "7g", 0))]),
    ("mig-suffixed-profile", {"mig": "1g.10gb"}, [("n1", (GpuSlot(0, 142, "1g.10gb", 3),))]),
    ("model-allowed", {"models": ("L40S-48GB",)}, [("n2", whole(1))]),
    ("other-pool", {"pool": "other"}, [("n3", whole(1))]),
    ("cpu-exact", {"cpu": 16_000, "mem": 64_000}, [("n1", whole(0))]),
]


@pytest.mark.parametrize("spec_kw, placements", [c[1:] for c in PLACEMENT_ACCEPTS],
                         ids=[c[0] for c in PLACEMENT_ACCEPTS])
def test_job_placed_accepted_books_capacity(spec_kw, placements):
    log = cluster()
    log.submit("j", **spec_kw)
    out = log.place("j", *placements)
    assert out.accepted, out.reason
    job = log.job("j")
    assert job.phase is JobPhase.PLACED and "j" not in log.state.pending
    assert len(job.workers) == job.spec.workers
    res = job.spec.resources
    expect_milli: dict[tuple[str, int], int] = {}
    expect_mask: dict[tuple[str, int], int] = {}
    for node, slots in placements:
        for s in slots:
            if s.mig_profile:
                expect_mask[(node, s.index)] = expect_mask.get((node, s.index), 0) | parse_profile(s.mig_profile).mask(s.mig_start)
            else:
                expect_milli[(node, s.index)] = expect_milli.get((node, s.index), 0) + s.milli
    for name, node in log.state.nodes.items():
        for g in node.gpus:
            assert g.used_milli == expect_milli.get((name, g.info.index), 0)
            assert g.mig_mask == expect_mask.get((name, g.info.index), 0)
        n_workers = sum(1 for n, _ in placements if n == name)
        assert node.used_cpu == n_workers * res.cpu_milli
        assert node.used_mem == n_workers * res.memory_mib
        assert ("j" in node.jobs) is (n_workers > 0)
    usage = log.state.usage["team-a"]
    assert usage.gpu_milli == job.spec.total_milli and usage.jobs == 1
    assert usage.cpu_milli == res.cpu_milli * job.spec.workers
    assert usage.memory_mib == res.memory_mib * job.spec.workers


def test_two_share_jobs_fill_one_gpu_then_a_third_is_rejected():
    log = cluster()
    for jid in ("a", "b", "c"):
        log.submit(jid, milli=500)
    assert log.place("a", ("n1", share(0, 500))).accepted
    assert log.place("b", ("n1", share(0, 500))).accepted
    assert log.node("n1").gpus[0].used_milli == 1000
    assert not log.place("c", ("n1", share(0, 500))).accepted


# --- workers ------------------------------------------------------------------------
def _placed_gang(n: int = 2, **spec_kw) -> Log:
    log = Log(make_node("n1", 4), make_node("n2", 4))
    log.submit("j", workers=n, **spec_kw)
    assert log.place("j", *[(f"n{1 + i % 2}", whole(i // 2)) for i in range(n)]).accepted
    return log


def test_gang_running_only_when_every_worker_started():
    log = _placed_gang(3)
    job = log.job("j")
    for w in job.workers:
        assert job.phase is JobPhase.PLACED
        assert log(ev.WorkerStarted, job_id="j", attempt=0, worker=w.worker, node=w.node).accepted
    assert job.phase is JobPhase.RUNNING and job.started_at > 0


@pytest.mark.parametrize("attempt, worker, node, reason", [
    (1, 0, "n1", "stale attempt"),
    (0, 0, "n2", "wrong node"),
    (0, 5, "n1", "unknown worker"),
    (0, 0, "n1", "started twice"),
])
def test_worker_started_rejects(attempt, worker, node, reason):
    log = _placed_gang(2)
    if reason == "started twice":
        assert log(ev.WorkerStarted, job_id="j", attempt=0, worker=0, node="n1").accepted
    started = set(log.job("j").started)
    out = log(ev.WorkerStarted, job_id="j", attempt=attempt, worker=worker, node=node)
    assert not out.accepted
    assert log.job("j").started == started and log.job("j").phase is JobPhase.PLACED


def test_worker_events_rejected_for_pending_or_unknown_jobs():
    log = Log(make_node("n1"))
    log.submit("j")
    for cls, extra in ((ev.WorkerStarted, {}), (ev.WorkerFinished, {"exit_code": 0})):
        for jid in ("j", "ghost"):
            out = log(cls, job_id=jid, attempt=0, worker=0, node="n1", **extra)
            assert not out.accepted
    assert log.job("j").phase is JobPhase.PENDING


def test_gang_succeeds_when_all_workers_exit_zero():
    log = _placed_gang(2)
    log.start_all("j")
    assert log.finish("j", 0, 0).accepted
    assert log.job("j").phase is JobPhase.RUNNING
    assert sum(g.used_milli for g in log.node("n1").gpus) == 1000   # still held
    assert not log.finish("j", 0, 0).accepted                        # finished twice
    assert log.finish("j", 1, 0).accepted
    job = log.job("j")
    assert job.phase is JobPhase.SUCCEEDED and job.ended_at > 0
    assert all(g.used_milli == 0 for n in log.state.nodes.values() for g in n.gpus)
    assert log.state.usage["team-a"].gpu_milli == 0 and log.state.usage["team-a"].jobs == 0
    # a terminal job accepts nothing more
    assert not log(ev.WorkerStarted, job_id="j", attempt=0, worker=0, node="n1").accepted
    assert not log(ev.JobCancelled, job_id="j").accepted
    assert not log(ev.JobPlaced, job_id="j", attempt=0, workers=()).accepted
    assert job.phase is JobPhase.SUCCEEDED


def test_nonzero_exit_retries_with_backoff_until_budget_then_fails():
    log = Log(make_node("n1", 2))
    log.submit("j", workers=2, max_restarts=3)
    for restart in range(1, 4):
        job = log.job("j")
        log.run("j", ("n1", whole(0)), ("n1", whole(1)))
        out = log.finish("j", 1, 7)        # one member fails: the whole gang restarts
        assert out.accepted
        # ... once its other member is stopped: until then it holds its GPU
        assert job.phase is JobPhase.STOPPING and log.node("n1").gpus[0].used_milli == 1000
        assert log.finish("j", 0, -9).accepted
        failed_at = log.now
        assert job.phase is JobPhase.PENDING and job.attempt == restart
        assert job.restarts == restart
        backoff = min(RETRY_BACKOFF_MAX_S, RETRY_BACKOFF_BASE_S * 2 ** (restart - 1))
        assert job.not_before == pytest.approx(failed_at + backoff)
        assert all(g.used_milli == 0 for g in log.node("n1").gpus) and log.node("n1").used_cpu == 0
        assert "exited 7" in job.reason
        # the old attempt's other worker is stale now
        assert not log(ev.WorkerFinished, job_id="j", attempt=restart - 1, worker=0, node="n1", exit_code=0).accepted
    log.run("j", ("n1", whole(0)), ("n1", whole(1)))
    assert log.finish("j", 0, 1).accepted
    job = log.job("j")
    assert job.phase is JobPhase.STOPPING and job.stop_then == "failed"
    assert log.finish("j", 1, 143).accepted
    assert job.phase is JobPhase.FAILED and job.restarts == 3 and "budget" in job.reason
    assert "j" not in log.state.pending and all(g.used_milli == 0 for g in log.node("n1").gpus)


def test_backoff_is_capped():
    log = Log(make_node("n1", 1))
    log.submit("j", max_restarts=30)
    for _ in range(12):
        log.run("j", ("n1", whole(0)))
        log.finish("j", 0, 1)
    job = log.job("j")
    assert job.restarts == 12 and job.not_before == pytest.approx(log.now + RETRY_BACKOFF_MAX_S)


def test_max_restarts_zero_fails_on_first_error():
    log = Log(make_node("n1", 1))
    log.submit("j", max_restarts=0)
    log.run("j", ("n1", whole(0)))
    assert log.finish("j", 0, 3).accepted
    assert log.job("j").phase is JobPhase.FAILED


@pytest.mark.parametrize("started", [False, True])
def test_exit_lost_requeues_without_charge(started):
    log = _placed_gang(2, max_restarts=0)
    if started:
        log.start_all("j")
    assert log.finish("j", 0, EXIT_LOST).accepted
    job = log.job("j")
    assert job.phase is JobPhase.STOPPING and job.stop_then == "requeue"
    log.stopped("j")
    assert job.phase is JobPhase.PENDING and job.attempt == 1
    assert job.restarts == 0 and job.not_before == 0.0
    assert all(g.used_milli == 0 for n in log.state.nodes.values() for g in n.gpus)


def test_checkpoint_saved_rules():
    log = Log(make_node("n1", 1))
    log.submit("j")
    assert not log(ev.CheckpointSaved, job_id="j", attempt=0, checkpoint="s3://x").accepted   # pending
    log.run("j", ("n1", whole(0)))
    assert log(ev.CheckpointSaved, job_id="j", attempt=0, checkpoint="c1", progress_s=50).accepted
    assert log(ev.CheckpointSaved, job_id="j", attempt=0, checkpoint="c2", progress_s=20).accepted
    job = log.job("j")
    assert job.checkpoint == "c2" and job.checkpoint_progress_s == 50   # progress never goes back
    assert job.checkpoint_at == log.now
    assert not log(ev.CheckpointSaved, job_id="j", attempt=1, checkpoint="c3").accepted     # stale
    assert not log(ev.CheckpointSaved, job_id="ghost", attempt=0, checkpoint="c3").accepted
    log.finish("j", 0, EXIT_LOST)
    assert job.checkpoint == "c2"    # survives the requeue: the next attempt resumes from it


# --- preemption ---------------------------------------------------------------------
def test_preempting_keeps_gpus_until_all_workers_finished():
    log = _placed_gang(2)
    log.start_all("j")
    before = capacity_snapshot(log.state)
    assert log(ev.JobPreempted, job_id="j", attempt=0, for_job="vip").accepted
    job = log.job("j")
    assert job.phase is JobPhase.PREEMPTING and job.nominated_by == "vip"
    assert capacity_snapshot(log.state) == before
    assert not log(ev.JobPreempted, job_id="j", attempt=0, for_job="vip2").accepted   # already
    assert log.finish("j", 0, 0).accepted
    assert job.phase is JobPhase.PREEMPTING and capacity_snapshot(log.state) == before
    assert log.finish("j", 1, 143).accepted      # killed by SIGTERM: still a preemption
    assert job.phase is JobPhase.PENDING and job.attempt == 1
    assert job.preemptions == 1 and job.restarts == 0 and job.not_before == 0.0
    assert "vip" in job.reason and job.nominated_by == ""
    assert all(g.used_milli == 0 for n in log.state.nodes.values() for g in n.gpus)


@pytest.mark.parametrize("case, reason", [
    ("not-preemptible", "not preemptible"),
    ("stale", "not running"),
    ("pending", "not running"),
    ("unknown", "not running"),
])
def test_job_preempted_rejects(case, reason):
    log = Log(make_node("n1", 1))
    log.submit("j", preemptible=case != "not-preemptible")
    if case != "pending":
        log.run("j", ("n1", whole(0)))
    attempt = 1 if case == "stale" else 0
    phase = log.job("j").phase
    out = log(ev.JobPreempted, job_id="ghost" if case == "unknown" else "j", attempt=attempt, for_job="x")
    assert not out.accepted and reason in out.reason
    assert log.job("j").phase is phase


def test_preempting_job_lost_node_requeues_not_counted_as_preemption():
    log = Log(make_node("n1", 1))
    log.submit("j")
    log.run("j", ("n1", whole(0)))
    log(ev.JobPreempted, job_id="j", attempt=0, for_job="x")
    assert log(ev.NodeLost, node="n1").accepted
    job = log.job("j")
    assert job.phase is JobPhase.PENDING and job.preemptions == 0 and job.restarts == 0
    assert log.node("n1").gpus[0].used_milli == 0


# --- idempotent replay ----------------------------------------------------------------
def test_duplicate_event_id_is_ignored():
    log = Log(make_node("n1", 2))
    log.submit("j")
    placed = ev.JobPlaced(event_id="p1", job_id="j", attempt=0, workers=(WorkerAssignment(0, "n1", whole(0)),))
    assert apply(log.state, placed).accepted
    log.finish("j", 0, EXIT_LOST)          # job back to pending at attempt 1
    applied, version, before = log.state.applied, log.state.version, capacity_snapshot(log.state)
    again = apply(log.state, placed)
    assert again.duplicate and not again.accepted
    assert log.state.applied == applied and log.state.version == version
    assert capacity_snapshot(log.state) == before and log.job("j").phase is JobPhase.PENDING


# --- capacity booking (shared by the reducer and the scheduler's tentative bookings) ---
@pytest.mark.parametrize("spec_kw, slots", [
    ({"gpus": 2}, [whole(0, 1), whole(2, 3)]),
    ({"milli": 300}, [share(0, 300), share(1, 300)]),
    ({"mig": "2g"}, [mig(0, "2g", 0), mig(0, "2g", 2)]),
])
def test_booking_a_gang_worker_by_worker_accounts_each_worker(spec_kw, slots):
    """The scheduler books a gang one worker at a time (place_gang): usage must grow
    with what was booked, like CPU and memory do, not by the whole gang per worker."""
    from gpusched.core.capacity import commit, release

    log = Log(make_node("n1", 4))
    log.submit("j", workers=2, cpu=100, mem=10, **spec_kw)
    job = log.job("j")
    ws = [WorkerAssignment(i, "n1", s) for i, s in enumerate(slots)]
    usage = log.state.team_usage("team-a")
    per_worker = job.spec.resources.milli
    commit(log.state, job, (ws[0],))
    assert (usage.gpu_milli, usage.cpu_milli, usage.memory_mib) == (per_worker, 100, 10)
    commit(log.state, job, (ws[1],))
    assert (usage.gpu_milli, usage.cpu_milli, usage.memory_mib) == (job.spec.total_milli, 200, 20)
    release(log.state, job, (ws[1],))
    assert (usage.gpu_milli, usage.cpu_milli, usage.memory_mib) == (per_worker, 100, 10)
    release(log.state, job, (ws[0],))
    assert (usage.gpu_milli, usage.cpu_milli, usage.memory_mib) == (0, 0, 0)


# --- supervisor verdicts ----------------------------------------------------------------
@pytest.mark.parametrize("charge, max_restarts, phase, restarts", [
    (True, 2, JobPhase.PENDING, 1),     # charged: a retry with back-off
    (True, 0, JobPhase.FAILED, 0),      # charged with no budget left: the job fails
    (False, 0, JobPhase.PENDING, 0),    # lost, not the job's fault: requeued for free
])
def test_attempt_failed(charge, max_restarts, phase, restarts):
    log = _placed_gang(2, max_restarts=max_restarts)
    log.start_all("j")
    out = log(ev.AttemptFailed, job_id="j", attempt=0, reason="hung", charge=charge)
    assert out.accepted
    job = log.job("j")
    assert job.phase is JobPhase.STOPPING and log.state.team_usage("team-a").gpu_milli == 2000
    log.stopped("j")
    assert job.phase is phase and job.restarts == restarts
    assert all(g.used_milli == 0 for n in log.state.nodes.values() for g in n.gpus)
    assert log.state.team_usage("team-a").gpu_milli == 0
    assert ("j" in log.state.pending) is (phase is JobPhase.PENDING)
    if phase is JobPhase.PENDING:
        assert job.attempt == 1
        assert job.not_before == (pytest.approx(log.now + RETRY_BACKOFF_BASE_S) if charge else 0.0)


@pytest.mark.parametrize("case", ["stale", "pending", "unknown", "ended"])
def test_attempt_failed_rejected_when_not_live(case):
    log = _placed_gang(1)
    if case == "pending":
        log.submit("p")
    if case == "ended":
        log.finish("j", 0, 0)
    job_id = {"pending": "p", "unknown": "ghost"}.get(case, "j")
    attempt = 1 if case == "stale" else 0
    before = capacity_snapshot(log.state)
    out = log(ev.AttemptFailed, job_id=job_id, attempt=attempt, reason="hung")
    assert not out.accepted and "not live" in out.reason
    assert capacity_snapshot(log.state) == before
    if job_id in log.state.jobs:
        assert log.job(job_id).restarts == 0


def test_uncordon_restores_gpu_health():
    log = Log(make_node("n1", 2))
    log.submit("j", gpus=2)
    for i in range(FAULTS_TO_QUARANTINE):
        log(ev.GpuHealthChanged, node="n1", gpu_index=i % 2, healthy=False)
    assert log.node("n1").status is NodeStatus.CORDONED
    assert not any(g.healthy for g in log.node("n1").gpus)
    assert log(ev.NodeUncordoned, node="n1").accepted
    assert all(g.healthy for g in log.node("n1").gpus)
    assert log.place("j", ("n1", whole(0, 1))).accepted


# --- nominations: capacity freed by preemption is kept for its beneficiary ---------------
def test_preemption_nominates_victim_nodes_for_a_pending_beneficiary():
    """Records without ``planned_nodes`` (written before the field existed)."""
    log = Log(make_node("n1", 1), make_node("n2", 1), make_node("n3", 1))
    for jid in ("v1", "v2"):
        log.submit(jid)
    log.run("v1", ("n2", whole(0)))
    log.run("v2", ("n1", whole(0)))
    log.submit("vip", workers=2)
    assert log(ev.JobPreempted, job_id="v1", attempt=0, for_job="vip").accepted
    assert log.state.nominations["vip"] == (("n2",), log.now)
    assert log(ev.JobPreempted, job_id="v2", attempt=0, for_job="vip").accepted
    assert log.state.nominations["vip"] == (("n1", "n2"), log.now)   # union, sorted, latest time
    log.finish("v1", 0, 0)
    log.finish("v2", 0, 0)
    assert "vip" in log.state.nominations            # still pending: the hold stays
    assert log.place("vip", ("n1", whole(0)), ("n2", whole(0))).accepted
    assert "vip" not in log.state.nominations        # placed: the hold is gone


def test_preemption_nominates_the_planned_nodes_when_given():
    # vip (3 x 1 GPU) planned on v's node n2 and on n3's two free GPUs: the plan is its
    # nomination, one node per worker, not v's node alone.
    log = Log(make_node("n1", 1), make_node("n2", 1), make_node("n3", 2))
    for jid in ("v", "w"):
        log.submit(jid)
    log.run("v", ("n2", whole(0)))
    log.run("w", ("n1", whole(0)))
    log.submit("vip", workers=3)
    assert log(ev.JobPreempted, job_id="v", attempt=0, for_job="vip", planned_nodes=("n3", "n2", "n3")).accepted
    assert log.state.nominations["vip"] == (("n3", "n2", "n3"), log.now)
    # a later plan replaces it (a nomination is one plan, not a union of plans)
    assert log(ev.JobPreempted, job_id="w", attempt=0, for_job="vip", planned_nodes=("n1", "n2", "n3")).accepted
    assert log.state.nominations["vip"] == (("n1", "n2", "n3"), log.now)
    # a plan naming a node the log does not know is not taken: the victim's node is nominated
    log.submit("other")
    log.run("other", ("n3", whole(0)))
    log.submit("vip2")
    assert log(ev.JobPreempted, job_id="other", attempt=0, for_job="vip2", planned_nodes=("n9",)).accepted
    assert log.state.nominations["vip2"] == (("n3",), log.now)
    log.finish("v", 0, 0)
    log.finish("w", 0, 0)
    assert log.place("vip", ("n1", whole(0)), ("n2", whole(0)), ("n3", whole(1))).accepted
    assert "vip" not in log.state.nominations


@pytest.mark.parametrize("beneficiary", ["unknown", "running", "cancelled"])
def test_no_nomination_for_a_beneficiary_that_is_not_pending(beneficiary):
    log = Log(make_node("n1", 2))
    log.submit("v")
    log.run("v", ("n1", whole(0)))
    if beneficiary != "unknown":
        log.submit("b")
        if beneficiary == "running":
            log.run("b", ("n1", whole(1)))
        else:
            log(ev.JobCancelled, job_id="b")
    assert log(ev.JobPreempted, job_id="v", attempt=0, for_job="b").accepted
    assert log.state.nominations == {}


def test_nomination_dropped_when_beneficiary_cancelled():
    log = Log(make_node("n1", 1))
    log.submit("v")
    log.run("v", ("n1", whole(0)))
    log.submit("b")
    log(ev.JobPreempted, job_id="v", attempt=0, for_job="b")
    assert "b" in log.state.nominations
    assert log(ev.JobCancelled, job_id="b").accepted
    assert log.state.nominations == {}


# --- known gaps (reported, not fixed: each needs a design decision) -----------------------
def test_cordon_survives_node_loss_and_reregistration():
    # An operator cordons a node for maintenance and reboots it: the agent is lost and
    # re-registers. The node should stay out of scheduling until uncordoned.
    log = Log(make_node("n1", 2))
    log(ev.NodeCordoned, node="n1", reason="maintenance")
    log(ev.NodeLost, node="n1")
    log(ev.NodeRegistered, node=make_node("n1", 2, agent="a2"))
    assert log.node("n1").status is NodeStatus.CORDONED


def test_reregistration_never_leaves_a_node_overbooked():
    log = Log(make_node("n1", 2, cpu=16_000))
    log.submit("j", cpu=12_000)
    log.run("j", ("n1", whole(0)))
    log(ev.NodeRegistered, node=make_node("n1", 2, cpu=8_000, agent="a2"))
    node = log.node("n1")
    assert node.used_cpu <= node.info.cpu_milli
