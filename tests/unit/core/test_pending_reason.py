"""``JobPendingReason``: stored on the pending attempt it names, dropped when the job is
placed or ends, and read by no decision."""
from __future__ import annotations

from gpusched.core import events as ev
from gpusched.core.model import NO_PENDING_REASON, NodeCount, PendingKind, PendingReason
from gpusched.policies.memory import CycleMemory
from gpusched.policies.scheduler import Scheduler
from tests.unit.core.builders import Log, make_node, make_spec, whole, workers

WAITS = PendingReason(PendingKind.NO_FIT, "0/1 nodes are available: 1 not enough free GPUs.", 1,
                      (NodeCount("gpus", 1),))


def pending_job() -> Log:
    log = Log(make_node("n1", gpus=4))
    assert log(ev.JobSubmitted, job_id="j", spec=make_spec(gpus=8)).accepted
    return log


def test_a_reason_is_kept_for_the_pending_attempt_it_names():
    log = pending_job()
    assert log(ev.JobPendingReason, job_id="j", attempt=0, reason=WAITS, time=50.0).accepted
    job = log.state.jobs["j"]
    assert (job.pending_reason, job.pending_reason_at) == (WAITS, 50.0)
    assert not log(ev.JobPendingReason, job_id="j", attempt=1, reason=WAITS).accepted      # stale or future
    assert not log(ev.JobPendingReason, job_id="nope", attempt=0, reason=WAITS).accepted
    assert not log(ev.JobPendingReason, job_id="j", attempt=0, reason=PendingReason()).accepted   # no kind
    assert job.pending_reason == WAITS


def test_it_is_dropped_when_the_job_is_placed_and_refused_after():
    log = Log(make_node("n1", gpus=4))
    log(ev.JobSubmitted, job_id="j", spec=make_spec(gpus=4))
    log(ev.JobPendingReason, job_id="j", attempt=0, reason=WAITS)
    assert log(ev.JobPlaced, job_id="j", attempt=0, workers=workers(("n1", whole(0, 1, 2, 3)))).accepted
    assert log.state.jobs["j"].pending_reason == NO_PENDING_REASON
    assert not log(ev.JobPendingReason, job_id="j", attempt=0, reason=WAITS).accepted


def test_it_is_dropped_when_the_job_ends():
    log = pending_job()
    log(ev.JobPendingReason, job_id="j", attempt=0, reason=WAITS)
    assert log(ev.JobCancelled, job_id="j").accepted
    assert log.state.jobs["j"].pending_reason == NO_PENDING_REASON


def test_no_decision_reads_it():
    """The same cycle with and without reasons stored (one that fits, one that does not)."""
    def cycle(with_reasons: bool):
        log = Log(make_node("n1", gpus=4), make_node("n2", gpus=4))
        for i, gpus in enumerate((8, 4, 2, 2)):
            log(ev.JobSubmitted, job_id=f"j{i}", spec=make_spec(gpus=gpus))
            if with_reasons:
                log(ev.JobPendingReason, job_id=f"j{i}", attempt=0, reason=WAITS)
        return [(d.job_id, d.workers) for d in Scheduler().cycle(log.state, log.now, CycleMemory())]
    assert cycle(True) == cycle(False) != []


def test_a_snapshot_keeps_it_and_one_taken_before_it_existed_restores_without():
    from gpusched.core.digest import digest
    from gpusched.core.snapshot import snapshot_bytes, snapshot_doc, encode_doc, state_from_snapshot

    log = pending_job()
    log(ev.JobPendingReason, job_id="j", attempt=0, reason=WAITS, time=50.0)
    restored = state_from_snapshot(snapshot_bytes(log.state))
    assert (restored.jobs["j"].pending_reason, restored.jobs["j"].pending_reason_at) == (WAITS, 50.0)
    assert digest(restored) == digest(log.state)
    doc = snapshot_doc(log.state)   # as written by code without the fields
    del doc["schema"]["PendingReason"], doc["schema"]["NodeCount"]
    doc["schema"]["JobState"] = [f for f in doc["schema"]["JobState"] if not f.startswith("pending_reason")]
    jobs = doc["state"]["jobs"]
    for column in ("pending_reason", "pending_reason_at"):
        _drop(jobs, column)
    assert state_from_snapshot(encode_doc(doc)).jobs["j"].pending_reason == NO_PENDING_REASON


def _drop(columns, name: str) -> None:
    """Remove a field's column wherever the nested column document holds it."""
    if isinstance(columns, dict):
        columns.pop(name, None)
        for value in columns.values():
            _drop(value, name)
