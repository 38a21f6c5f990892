"""The job lifecycle's ending half (docs/guide/workloads.md): STOPPING holds resources until
every worker's end is reported, time limits, rendezvous, and fencing verdicts."""
from __future__ import annotations

import pytest

from gpusched.core import events as ev
from gpusched.core.model import JobPhase, JobSpec, WorkerResources
from gpusched.core.reducer import FENCE_MARGIN_S
from gpusched.policies.supervision import nodes_to_fence, timed_out_attempts

from .builders import Log, capacity_snapshot, make_node, make_spec, whole


def _running_gang(log: Log, job_id: str = "j", **spec) -> None:
    log.submit(job_id, workers=2, **spec)
    log.run(job_id, ("n1", whole(0)), ("n2", whole(0)))


def _two_nodes(**kw) -> Log:
    return Log(make_node("n1", 1, **kw), make_node("n2", 1, **kw))


# --- stopping -------------------------------------------------------------------------
@pytest.mark.parametrize("end, then, final", [
    (lambda log: log(ev.JobCancelled, job_id="j"), "cancelled", JobPhase.CANCELLED),
    (lambda log: log(ev.AttemptTimedOut, job_id="j", attempt=0), "timeout", JobPhase.TIMEOUT),
    (lambda log: log(ev.AttemptFailed, job_id="j", attempt=0, reason="hung"), "retry", JobPhase.PENDING),
    (lambda log: log(ev.AttemptFailed, job_id="j", attempt=0, charge=False), "requeue", JobPhase.PENDING),
    (lambda log: log(ev.GpuHealthChanged, node="n2", gpu_index=0, healthy=False), "requeue", JobPhase.PENDING),
    (lambda log: log.finish("j", 1, 9), "retry", JobPhase.PENDING),
])
def test_every_early_end_holds_everything_until_the_last_worker_is_gone(end, then, final):
    log = _two_nodes()
    _running_gang(log)
    held = capacity_snapshot(log.state)
    assert end(log).accepted
    job = log.job("j")
    assert job.phase is JobPhase.STOPPING and job.stop_then == then
    assert capacity_snapshot(log.state)[1] == held[1]             # the team's usage is unchanged
    assert "j" in log.node("n1").jobs and "j" in log.node("n2").jobs
    assert not log.place("j", ("n1", whole(0)), ("n2", whole(0))).accepted   # no new attempt yet
    log.stopped("j")
    assert job.phase is final and job.stop_then == ""
    assert not log.node("n1").jobs and not log.node("n2").jobs
    assert log.state.team_usage("team-a").gpu_milli == 0


def test_cancel_while_stopping_for_a_requeue_ends_the_job_and_a_requeue_does_not_undo_a_cancel():
    log = _two_nodes()
    _running_gang(log)
    assert log(ev.AttemptFailed, job_id="j", attempt=0, charge=False).accepted
    assert log(ev.JobCancelled, job_id="j").accepted
    assert log.job("j").stop_then == "cancelled"
    assert log(ev.GpuHealthChanged, node="n1", gpu_index=0, healthy=False).accepted
    assert log.job("j").stop_then == "cancelled"
    log.stopped("j")
    assert log.job("j").phase is JobPhase.CANCELLED


def test_a_stopping_job_is_neither_preempted_nor_failed_again():
    log = _two_nodes()
    _running_gang(log)
    log(ev.JobCancelled, job_id="j")
    assert not log(ev.JobPreempted, job_id="j", attempt=0, for_job="x").accepted
    assert not log(ev.AttemptFailed, job_id="j", attempt=0).accepted
    assert not log(ev.AttemptTimedOut, job_id="j", attempt=0).accepted   # the cancel stands


def test_preempted_gang_counts_one_preemption_once_every_worker_is_gone():
    log = _two_nodes()
    _running_gang(log)
    log.submit("vip")
    assert log(ev.JobPreempted, job_id="j", attempt=0, for_job="vip").accepted
    assert log.finish("j", 0, 143).accepted
    assert log.job("j").phase is JobPhase.PREEMPTING and log.node("n2").jobs == {"j"}
    assert log.finish("j", 1, 143).accepted
    job = log.job("j")
    assert job.phase is JobPhase.PENDING and job.preemptions == 1 and job.restarts == 0


# --- time limits ------------------------------------------------------------------------
def test_pool_default_time_limit_applies_to_jobs_without_one_and_the_maximum_refuses_more():
    log = _two_nodes()
    assert log(ev.PoolTimeLimitsSet, pool="default", default_s=600.0, max_s=3600.0).accepted
    assert log.submit("plain").accepted and log.job("plain").time_limit_s == 600.0
    asks = JobSpec(name="a", team="t", resources=WorkerResources(gpus=1), max_runtime_s=1200.0)
    assert log.submit("asks", asks).accepted and log.job("asks").time_limit_s == 1200.0
    greedy = JobSpec(name="g", team="t", resources=WorkerResources(gpus=1), max_runtime_s=7200.0)
    out = log.submit("greedy", greedy)
    assert not out.accepted and "spec.max_runtime_s" in out.reason and "greedy" not in log.state.jobs
    other = JobSpec(name="o", team="t", pool="other", resources=WorkerResources(gpus=1))
    assert log(ev.PoolCreated, pool="other").accepted
    assert log.submit("other", other).accepted and log.job("other").time_limit_s == 0.0


@pytest.mark.parametrize("default_s, max_s, ok", [
    (0.0, 0.0, True), (60.0, 0.0, True), (60.0, 60.0, True), (120.0, 60.0, False),
    (-1.0, 0.0, False), (float("nan"), 0.0, False), (0.0, float("inf"), False),
])
def test_pool_time_limits_are_validated(default_s, max_s, ok):
    log = Log()
    out = log(ev.PoolTimeLimitsSet, pool="default", default_s=default_s, max_s=max_s)
    assert out.accepted is ok
    assert ("default" in log.state.pool_limits) is ok


def test_timed_out_attempt_ends_as_timeout_and_is_not_retried():
    log = _two_nodes()
    log.submit("j", workers=2, max_restarts=3)
    log.run("j", ("n1", whole(0)), ("n2", whole(0)))
    assert log(ev.AttemptTimedOut, job_id="j", attempt=0).accepted
    log.stopped("j")
    job = log.job("j")
    assert job.phase is JobPhase.TIMEOUT and job.restarts == 0 and "time limit" in job.reason
    assert "j" not in log.state.pending


def test_supervisor_times_out_attempts_past_their_limit_from_their_start():
    log = _two_nodes()
    log(ev.PoolTimeLimitsSet, pool="default", default_s=10.0)
    log.submit("j")
    log.run("j", ("n1", whole(0)))
    started = log.job("j").started_at
    assert timed_out_attempts(log.state, started + 9.9) == []
    [(job_id, attempt, reason)] = timed_out_attempts(log.state, started + 10.0)
    assert (job_id, attempt) == ("j", 0) and "10s" in reason
    log(ev.AttemptTimedOut, job_id="j", attempt=0)
    assert timed_out_attempts(log.state, started + 100) == []    # stopping: judged once


# --- fencing ----------------------------------------------------------------------------
def test_supervisor_fences_a_lost_node_only_once_its_lease_and_kill_deadline_passed():
    log = Log(make_node("n1", 1, lease=4.0, kill_wait=2.0), make_node("n2", 1))
    log.submit("j")
    log.run("j", ("n1", whole(0)))
    assert nodes_to_fence(log.state, log.now + 100) == []        # not lost
    log(ev.NodeLost, node="n1")
    fence_at = log.node("n1").fence_at
    assert fence_at == log.now + 6.0 + FENCE_MARGIN_S
    assert nodes_to_fence(log.state, fence_at - 0.01) == []
    assert nodes_to_fence(log.state, fence_at) == ["n1"]
    assert log(ev.NodeFenced, node="n1", time=fence_at).accepted
    assert nodes_to_fence(log.state, fence_at + 100) == []       # nothing held any more


def test_agent_reports_from_a_lost_node_end_its_work_before_the_fence():
    """A partitioned agent that comes back kills its work and reports it: no need to
    wait for the fence."""
    log = Log(make_node("n1", 1, lease=4.0, kill_wait=2.0))
    log.submit("j")
    log.run("j", ("n1", whole(0)))
    log(ev.NodeLost, node="n1")
    log.stopped("j")
    assert log.job("j").phase is JobPhase.PENDING and not log.node("n1").jobs
    assert log(ev.NodeRegistered, node=make_node("n1", 1, agent="a2", lease=4.0, kill_wait=2.0)).accepted
    assert log.node("n1").fence_at == 0.0 and log.node("n1").schedulable


# --- rendezvous -------------------------------------------------------------------------
def test_rendezvous_is_set_once_per_attempt_by_worker_zeros_node_and_cleared_on_restart():
    log = _two_nodes()
    _running_gang(log)
    assert not log(ev.RendezvousSet, job_id="j", attempt=0, node="n2", address="10.0.0.2", port=29500).accepted
    assert not log(ev.RendezvousSet, job_id="j", attempt=0, node="n1", address="10.0.0.1", port=0).accepted
    assert log(ev.RendezvousSet, job_id="j", attempt=0, node="n1", address="10.0.0.1", port=29500).accepted
    assert log.job("j").rendezvous == "10.0.0.1:29500"
    assert not log(ev.RendezvousSet, job_id="j", attempt=0, node="n1", address="10.0.0.1", port=29501).accepted
    log.finish("j", 1, 1)
    log.stopped("j")
    assert log.job("j").rendezvous == "" and log.job("j").attempt == 1
    assert not log(ev.RendezvousSet, job_id="j", attempt=0, node="n1", address="10.0.0.1", port=29502).accepted
