"""``gpusched describe job``'s text: the retry policy in words and every attempt that
failed, with its cause, exit code and whether it counted."""
from __future__ import annotations

from gpusched.ctl.jobs import job_lines
from gpusched.v1 import types_pb2


def test_a_jobs_failed_attempts_are_listed_by_cause():
    job = types_pb2.Job(job_id="j1", phase=types_pb2.JOB_PHASE_FAILED, attempt=1)
    job.spec.retry.add(cause=types_pb2.FAILURE_CAUSE_EXIT, exit_codes=[2], action=types_pb2.RETRY_ACTION_FAIL)
    job.spec.retry.add(cause=types_pb2.FAILURE_CAUSE_OOM, max_restarts=1)
    job.failures.add(attempt=0, cause=types_pb2.FAILURE_CAUSE_NODE, reason="node n1 lost")
    job.failures.add(attempt=1, cause=types_pb2.FAILURE_CAUSE_EXIT, exit_code=2, reason="worker 0 exited 2")
    lines = job_lines(job)
    assert "Retry:        exit 2 -> fail; oom -> count (1)" in lines
    failed = lines[lines.index("Attempts that failed:") + 1:]
    assert [line.split()[0] for line in failed] == ["0", "1"]
    assert "node" in failed[0] and "not counted" in failed[0] and failed[0].endswith("node n1 lost")
    assert "exit 2" in failed[1]


def test_a_job_that_never_failed_lists_no_attempts():
    assert "Attempts that failed:" not in job_lines(types_pb2.Job(job_id="j1"))
