"""``gpusched describe job`` and ``get jobs`` (gpusched/ctl/jobs.py): the retry policy in
words, every attempt that failed with its cause, exit code and whether it counted; an
array as one line, its tasks with ``--expand``."""
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


def test_get_jobs_shows_an_array_as_one_line_and_its_tasks_with_expand(monkeypatch):
    from click.testing import CliRunner

    from gpusched.cli import cli
    from gpusched.ctl import jobs
    parent = types_pb2.Job(job_id="a", phase=types_pb2.JOB_PHASE_RUNNING)
    parent.spec.name = "sweep"
    parent.array.count, parent.array.ended, parent.array.failed = 4, 2, 1
    tasks = [types_pb2.Job(job_id=f"a.{i}", array_of="a", array_index=i, phase=types_pb2.JOB_PHASE_SUCCEEDED)
             for i in (1, 0)]
    monkeypatch.setattr(jobs.SyncClient, "list_all", lambda self, *a, **kw: [tasks[0], parent, tasks[1]])
    short = CliRunner().invoke(cli, ["get", "jobs"])
    assert short.exit_code == 0, short.output
    rows = short.output.splitlines()[1:]
    assert len(rows) == 1 and "Running 2/4 (1 failed)" in rows[0]
    expanded = CliRunner().invoke(cli, ["get", "jobs", "--expand"]).output.splitlines()[1:]
    assert [r.split()[0] for r in expanded] == ["a", "a.0", "a.1"]


def test_describe_shows_dependencies_and_an_arrays_progress():
    job = types_pb2.Job(job_id="a")
    job.spec.depends_on.add(job="prep", when=types_pb2.DEPENDENCY_CONDITION_FINISHED)
    job.spec.array.count, job.spec.array.parallel = 10, 2
    job.array.count, job.array.ended, job.array.failed, job.array.running = 10, 4, 1, 2
    lines = job_lines(job)
    assert "Depends on:   prep (finished)" in lines
    assert "Array:        10 tasks, 2 at a time: 4 ended (1 not succeeded), 2 queued or running" in lines
    assert "Array task:   index 3 of a" in job_lines(types_pb2.Job(job_id="a.3", array_of="a", array_index=3))


def test_describe_shows_a_topology_request_only_when_one_is_set():
    job = types_pb2.Job(job_id="g")
    assert not any(line.startswith("Topology:") for line in job_lines(job))
    job.spec.topology.required, job.spec.topology.preferred = "rack", "block"
    job.spec.topology.slice.level, job.spec.topology.slice.workers = "block", 4
    assert "Topology:     required rack, preferred block, slices of 4 workers per block" in job_lines(job)
