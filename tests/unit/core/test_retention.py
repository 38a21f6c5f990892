"""Retention of finished jobs (``gpusched.core.retention``): which jobs go, and when."""
from __future__ import annotations

import pytest

from gpusched.core import events as ev
from gpusched.core.digest import digest
from gpusched.core.model import JobPhase
from gpusched.core.reducer import apply
from gpusched.core.retention import prune_finished
from gpusched.core.snapshot import snapshot_bytes, state_from_snapshot
from gpusched.core.state import ClusterState

from .builders import Log, capacity_snapshot, make_node, whole

RETENTION = 100.0


def succeeded(log: Log, job_id: str, key: str = "") -> float:
    """Submit, run and finish ``job_id`` on n1; when it ended."""
    assert log.submit(job_id, key=key, gpus=1).accepted
    log.run(job_id, ("n1", whole(0)))
    assert log.finish(job_id, 0, 0).accepted
    assert log.job(job_id).phase is JobPhase.SUCCEEDED
    return log.job(job_id).ended_at


def tick(log: Log, at: float) -> None:
    """Any event moves the log's clock, even one the reducer rejects: here a cordon of a
    node that does not exist."""
    log.now = at - 1.0   # Log adds 1 s per event
    assert not log(ev.NodeCordoned, node="no-such-node").accepted
    assert log.state.clock == at


@pytest.mark.parametrize("age, kept", [
    (RETENTION - 1, True),     # younger than the retention
    (RETENTION, False),        # exactly as old: goes
    (RETENTION + 50, False),
])
def test_a_finished_job_goes_once_the_log_clock_passes_its_retention(age, kept):
    log = Log(make_node("n1", 2), retention_s=RETENTION)
    ended = succeeded(log, "j1")
    tick(log, ended + age)
    assert ("j1" in log.state.jobs) is kept
    assert log.state.pruned == (0 if kept else 1)


@pytest.mark.parametrize("end", ["succeeded", "failed", "cancelled"])
def test_every_terminal_phase_is_pruned(end):
    log = Log(make_node("n1", 2), retention_s=RETENTION)
    log.submit("j1", gpus=1, max_restarts=0)
    if end == "cancelled":
        assert log(ev.JobCancelled, job_id="j1", reason="user").accepted
    else:
        log.run("j1", ("n1", whole(0)))
        assert log.finish("j1", 0, 0 if end == "succeeded" else 3).accepted
    assert log.job("j1").phase.value == end
    tick(log, log.now + RETENTION + 1)
    assert "j1" not in log.state.jobs


def test_live_jobs_are_never_pruned_however_old():
    log = Log(make_node("n1", 4), retention_s=RETENTION)
    succeeded(log, "done")
    log.submit("pending", gpus=8)     # cannot fit: stays pending
    log.submit("running", gpus=1)
    log.run("running", ("n1", whole(1)))
    before = capacity_snapshot(log.state)
    tick(log, log.now + 10 * RETENTION)
    assert set(log.state.jobs) == {"pending", "running"}
    assert list(log.state.pending) == ["pending"]
    assert capacity_snapshot(log.state) == before


def test_retention_zero_keeps_every_job():
    log = Log(make_node("n1", 2))
    succeeded(log, "j1")
    tick(log, log.now + 1e9)
    assert "j1" in log.state.jobs and log.state.pruned == 0 and not log.state.ended


def test_the_job_that_ends_in_an_event_is_still_there_for_its_handlers():
    """An end stamped far behind the log's clock (a slow producer) is pruned at the next
    clock advance, not while its own event is applied."""
    log = Log(make_node("n1", 2), retention_s=RETENTION)
    log.submit("j1", gpus=1)
    log.run("j1", ("n1", whole(0)))
    tick(log, log.now + 10 * RETENTION)
    job = log.job("j1")
    out = log.replay(ev.WorkerFinished(event_id="late", time=1.0, producer="agent", job_id="j1",
                                       attempt=job.attempt, worker=0, node="n1", exit_code=0))
    assert out.accepted and out.jobs == ("j1",) and "j1" in log.state.jobs
    tick(log, log.now + 2)
    assert "j1" not in log.state.jobs


def test_pruning_frees_the_idempotency_key_for_a_new_job():
    log = Log(make_node("n1", 2), retention_s=RETENTION)
    succeeded(log, "j1", key="nightly")
    assert not log.submit("j2", key="nightly", gpus=1).accepted   # still held
    tick(log, log.now + RETENTION + 1)
    assert log.state.idempotency == {}
    out = log.submit("j2", key="nightly", gpus=1)
    assert out.accepted and log.state.idempotency == {"team-a/nightly": "j2"}


def test_a_pruned_job_id_can_be_submitted_again_as_a_new_job():
    log = Log(make_node("n1", 2), retention_s=RETENTION)
    succeeded(log, "j1")
    tick(log, log.now + RETENTION + 1)
    assert log.submit("j1", gpus=1).accepted
    assert log.job("j1").phase is JobPhase.PENDING and log.job("j1").attempt == 0


def test_jobs_go_in_the_order_they_ended_and_the_queue_is_compacted():
    retention = 1e6   # longer than the 5,000 jobs take
    log = Log(make_node("n1", 2), retention_s=retention)
    ends = [succeeded(log, f"j{i}") for i in range(5000)]
    assert len(log.state.ended) == 5000 and log.state.prune_at == ends[0] + retention
    tick(log, ends[4500] + retention)            # the first 4,501 are old enough
    assert sorted(log.state.jobs, key=lambda j: int(j[1:])) == [f"j{i}" for i in range(4501, 5000)]
    assert log.state.pruned == 4501
    assert log.state.ended_head == 0 and len(log.state.ended) == 499   # cut off in bulk
    assert log.state.prune_at == ends[4501] + retention
    tick(log, log.now + retention + 1)
    assert log.state.jobs == {} and log.state.prune_at == 0.0


def test_few_pruned_jobs_are_skipped_over_not_cut_off():
    log = Log(make_node("n1", 2), retention_s=RETENTION)
    succeeded(log, "j1")
    succeeded(log, "j2")
    tick(log, log.state.jobs["j1"].ended_at + RETENTION)
    assert log.state.ended == ["j1", "j2"] and log.state.ended_head == 1


def test_prune_finished_is_idempotent():
    log = Log(make_node("n1", 2), retention_s=RETENTION)
    succeeded(log, "j1")
    succeeded(log, "j2")
    log.state.clock += RETENTION
    assert prune_finished(log.state) == 2
    assert prune_finished(log.state) == 0 and log.state.pruned == 2


def test_snapshot_carries_the_retention_queue_and_replicas_agree():
    log = Log(make_node("n1", 2), retention_s=RETENTION)
    for i in range(6):
        succeeded(log, f"j{i}")
        log.now += 30
    tick(log, log.now)
    restored = state_from_snapshot(snapshot_bytes(log.state))
    assert restored.retention_s == RETENTION and restored.pruned == log.state.pruned > 0
    assert digest(restored) == digest(log.state)
    # the same tail on both: the same jobs go at the same events
    tail = [ev.NodeRegistered(event_id=f"t{i}", time=log.now + 40 * i, producer="x", node=make_node(f"x{i}", 1))
            for i in range(1, 6)]
    for e in tail:
        apply(log.state, e)
        apply(restored, e)
        assert digest(restored) == digest(log.state)
    assert log.state.jobs == {}


def test_state_default_is_no_retention():
    assert ClusterState().retention_s == 0.0


# --- the retention recorded in the log (JobRetentionSet) ----------------------------------
def test_setting_a_retention_on_a_log_that_had_none_queues_the_jobs_that_ended_in_their_end_order():
    log = Log(make_node("n1", 2))                       # retention off: nothing queued
    ends = [succeeded(log, f"j{i}") for i in range(3)]
    assert not log.state.ended
    assert log(ev.JobRetentionSet, job_retention_s=RETENTION).accepted
    assert log.state.retention_s == RETENTION and log.state.ended == ["j0", "j1", "j2"]
    assert log.state.prune_at == ends[0] + RETENTION
    tick(log, ends[1] + RETENTION)                      # j0 and j1 are old enough
    assert sorted(log.state.jobs) == ["j2"]


def test_a_shorter_retention_prunes_at_the_next_event_that_moves_the_clock():
    log = Log(make_node("n1", 2), retention_s=RETENTION)
    ended = succeeded(log, "j1")
    assert log(ev.JobRetentionSet, job_retention_s=1.0).accepted
    tick(log, ended + 2.0)
    assert "j1" not in log.state.jobs and log.state.pruned == 1


def test_retention_set_to_zero_keeps_every_job_from_then_on():
    log = Log(make_node("n1", 2), retention_s=RETENTION)
    ended = succeeded(log, "j1")
    assert log(ev.JobRetentionSet, job_retention_s=0.0).accepted
    tick(log, ended + 10 * RETENTION)
    assert "j1" in log.state.jobs and not log.state.ended and log.state.prune_at == 0.0


@pytest.mark.parametrize("seconds", [-1.0, float("nan"), float("inf")])
def test_a_retention_that_is_not_a_finite_number_of_seconds_is_rejected(seconds):
    log = Log(make_node("n1", 2), retention_s=RETENTION)
    succeeded(log, "j1")
    before = (log.state.retention_s, list(log.state.ended), log.state.prune_at)
    out = log(ev.JobRetentionSet, job_retention_s=seconds)
    assert not out.accepted and "finite number of seconds" in out.reason
    assert (log.state.retention_s, log.state.ended, log.state.prune_at) == before
