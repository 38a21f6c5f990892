"""Service commands (gpusched/ctl/services.py): a service file read into a ServiceSpec,
``describe service``, ``get services|endpoints``, ``scale``, ``delete service``, ``rollout
status|undo`` against a client that answers as admission would, and an API refusal
printed as one line."""
from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest
from click.testing import CliRunner

from gpusched.cli import cli
from gpusched.ctl import jobfile, services
from gpusched.v1 import admission_pb2, types_pb2

SERVICE_FILE = """\
kind: Service
name: web
team: ml
replicas: 3
min_replicas: 2
max_replicas: 6
update: {max_surge: 2, max_unavailable: 1}
autoscaling: {metric: requests_in_flight, target: 8, scale_down_window: 5m}
template:
  resources: {gpus: 1}
  command: [python, serve.py]
  serve_port: true
  readiness: {http_path: /healthz, period: 2s, initial_delay: 30s}
"""


def test_a_service_file_is_read_into_the_apis_spec(tmp_path: Path):
    path = tmp_path / "web.yaml"
    path.write_text(SERVICE_FILE)
    [doc] = jobfile.load_docs(path)
    spec = jobfile.parse_service(doc)
    assert (spec.name, spec.team, spec.replicas, spec.min_replicas, spec.max_replicas) == ("web", "ml", 3, 2, 6)
    assert (spec.update.max_surge, spec.update.max_unavailable) == (2, 1)
    assert spec.autoscaling.metric == types_pb2.SCALING_METRIC_REQUESTS_IN_FLIGHT
    assert spec.autoscaling.scale_down_window.seconds == 300 and spec.autoscaling.target == 8
    t = spec.template
    assert list(t.command) == ["python", "serve.py"] and t.serve_port and t.resources.gpus == 1
    assert t.resources.cpu_milli == 1000 and t.resources.memory_mib == 4096     # a job file's defaults
    assert t.readiness.http_path == "/healthz" and t.readiness.period.seconds == 2
    assert t.readiness.initial_delay.seconds == 30
    assert not spec.HasField("preemptible")                        # left to the API's default


@pytest.mark.parametrize("doc, named", [
    ({"name": "web", "replica": 2}, "replica: unknown field"),
    ({"name": "web", "template": {"readiness": {"period": "soon"}}}, "template.readiness.period: must be a span"),
    ({"name": "web", "autoscaling": {"metric": "cpu"}}, "autoscaling.metric: unknown value 'cpu'"),
    ({"kind": "Job", "name": "web"}, "kind: only Service"),
    (["web"], "a service is a mapping"),
])
def test_a_bad_service_file_names_the_field(doc, named):
    with pytest.raises(jobfile.JobFileError) as err:
        jobfile.parse_service(doc, "web.yaml")
    assert str(err.value).startswith("web.yaml: ") and named in str(err.value)


def service(rollout: str = "complete", done: bool = True) -> types_pb2.Service:
    msg = types_pb2.Service(desired=2, revision=3, replicas=2, updated=2, ready=1, rollout=rollout,
                            rollout_done=done, revisions=[2, 3], scaled_reason="applied")
    msg.spec.name, msg.spec.team, msg.spec.pool, msg.spec.min_replicas = "web", "ml", "default", 1
    msg.spec.template.resources.gpus = 1
    msg.spec.template.command.append("serve")
    msg.replica.add(job_id="web-4", revision=3, phase=types_pb2.JOB_PHASE_RUNNING, ready=True,
                    endpoint="10.0.0.5:31000", nodes=["node-0"])
    msg.replica.add(job_id="web-5", revision=3, phase=types_pb2.JOB_PHASE_PENDING, reason="0/1 nodes have 1 free GPU")
    return msg


def test_describe_service_shows_the_rollout_and_each_replica():
    lines = services.service_lines(service("rolling out revision 3: 2 of 2 updated, 1 ready", False))
    assert "Rollout:      rolling out revision 3: 2 of 2 updated, 1 ready" in lines
    assert "Revision:     3 (kept: 2, 3)" in lines
    assert any(line.startswith("Replicas:     2 desired (1..no bound; applied)") for line in lines)
    rows = lines[lines.index("Replicas:") + 1:lines.index("Reasons:")]
    assert rows[0].split() == ["web-4", "rev", "3", "Running", "ready", "10.0.0.5:31000", "node-0"]
    assert rows[1].split()[:5] == ["web-5", "rev", "3", "Pending", "not"] and rows[1].split()[-2:] == ["-", "-"]
    assert lines[-1] == "  web-5: 0/1 nodes have 1 free GPU"


class FakeClient:
    """Answers as admission would; records what it was asked."""

    def __init__(self, answers: list[types_pb2.Service] | None = None) -> None:
        self.answers = answers or [service()]
        self.asked: list[tuple] = []

    def get_service(self, name):
        self.asked.append(("get", name))
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]

    def list_services(self, team="", pool=""):
        self.asked.append(("list", team, pool))
        return [service()]

    def scale_service(self, name, replicas, reason=""):
        self.asked.append(("scale", name, replicas))
        if replicas > 6:
            raise grpc.aio.AioRpcError(grpc.StatusCode.INVALID_ARGUMENT, grpc.aio.Metadata(), grpc.aio.Metadata(),
                                       "replicas: 9 is outside min_replicas..max_replicas (1..6)")
        answer = service()
        answer.desired = replicas
        return answer

    def rollback_service(self, name, revision=0):
        self.asked.append(("rollback", name, revision))
        answer = service()
        answer.revision = 4
        return answer

    def delete_service(self, name):
        self.asked.append(("delete", name))
        return service()

    def apply_service(self, spec):
        self.asked.append(("apply", spec.name, spec.replicas))
        return service()

    def watch_endpoints(self, name):
        yield admission_pb2.Endpoints(service=name, endpoints=[
            admission_pb2.Endpoint(replica="web-4", address="10.0.0.5", port=31000, revision=3)])
        yield admission_pb2.Endpoints(service=name, deleted=True)


@pytest.fixture
def fake(monkeypatch) -> FakeClient:
    client = FakeClient()
    monkeypatch.setattr("gpusched.ctl.root.State.client", lambda self: client)
    return client


def run(*args: str):
    return CliRunner().invoke(cli, list(args))


def test_get_services_and_endpoints(fake):
    out = run("get", "services", "--team", "ml")
    assert out.exit_code == 0, out.output
    header, row = out.output.splitlines()
    assert header.split() == ["NAME", "TEAM", "POOL", "READY", "UP-TO-DATE", "REVISION", "AGE"]
    assert row.split()[:6] == ["web", "ml", "default", "1/2", "2", "3"] and ("list", "ml", "") in fake.asked
    out = run("get", "endpoints", "web")
    assert out.exit_code == 0 and out.output == "10.0.0.5:31000 web-4 3\n", out.output
    watched = run("get", "endpoints", "web", "--watch")       # until the service goes
    assert watched.exit_code == 1 and "10.0.0.5:31000 web-4 3" in watched.output
    assert "service web deleted" in watched.output


def test_apply_scale_undo_and_delete_print_what_happened(fake, tmp_path: Path):
    path = tmp_path / "web.yaml"
    path.write_text(SERVICE_FILE)
    out = run("apply", "-f", str(path))
    assert out.exit_code == 0 and out.output == "service/web applied (revision 3, 2 replicas)\n", out.output
    assert ("apply", "web", 3) in fake.asked
    assert run("scale", "web", "--replicas", "4").output == "service/web scaled to 4\n"
    refused = run("scale", "web", "--replicas", "9")
    assert refused.exit_code == 1
    assert refused.output == "Error: INVALID_ARGUMENT: replicas: 9 is outside min_replicas..max_replicas (1..6)\n"
    assert run("rollout", "undo", "web", "--to-revision", "2").output == "service/web rolled back (now revision 4)\n"
    assert ("rollback", "web", 2) in fake.asked
    assert run("delete", "service", "web").output == "service/web deleted (2 replicas stopping)\n"
    assert ("delete", "web") in fake.asked


def test_rollout_status_waits_until_complete_and_fails_when_stalled(fake):
    fake.answers = [service("rolling out revision 3: 1 of 2 updated, 1 ready", False), service()]
    out = run("rollout", "status", "web", "--poll", "0")
    assert out.exit_code == 0, out.output
    assert out.output.splitlines() == ["service/web: rolling out revision 3: 1 of 2 updated, 1 ready",
                                       "service/web: complete"]
    fake.answers = [service("stalled: revision 3 not ready after 600s (1 of 2 updated, 1 ready)", False)]
    stalled = run("rollout", "status", "web", "--poll", "0")
    assert stalled.exit_code == 1 and "stalled" in stalled.output
    fake.answers = [service("rolling out revision 3: 1 of 2 updated, 1 ready", False)]
    late = run("rollout", "status", "web", "--timeout", "0s", "--poll", "0")
    assert late.exit_code == 1 and "timed out after 0s" in late.output
    bad = run("rollout", "status", "web", "--timeout", "soon")
    assert bad.exit_code == 2 and "--timeout" in bad.output


def replica_job(job_id: str, phase: int, gpus: int = 1, workers: int = 1) -> types_pb2.Job:
    job = types_pb2.Job(job_id=job_id, phase=phase)
    job.spec.team, job.spec.workers, job.spec.resources.gpus = "ml", workers, gpus
    return job


def test_top_services_shows_gpus_held_by_live_replicas_and_the_rollout(fake, monkeypatch):
    asked = []

    def list_all(team="", pool="", phases=()):
        asked.append((team, pool, set(phases)))
        return [replica_job("web-4", types_pb2.JOB_PHASE_RUNNING, gpus=2),      # an older revision's 2 GPUs
                replica_job("web-6", types_pb2.JOB_PHASE_PLACED, workers=2),
                replica_job("train-1", types_pb2.JOB_PHASE_RUNNING)]             # not a replica
    fake.list_all = list_all
    rolling = service("rolling out revision 3: 1 of 2 updated, 1 ready", False)
    rolling.scaled_reason = "requests_in_flight 20 over target 8 per replica"
    rolling.replica.add(job_id="web-6", revision=3, phase=types_pb2.JOB_PHASE_PLACED)
    rolling.replica.add(job_id="web-7", revision=3, phase=types_pb2.JOB_PHASE_RUNNING)   # not listed: the template's
    monkeypatch.setattr(fake, "list_services", lambda team="", pool="": [rolling])
    out = run("top", "services", "--team", "ml")
    assert out.exit_code == 0, out.output
    header, row = out.output.splitlines()
    assert header.split() == ["NAME", "TEAM", "POOL", "READY", "UPDATED", "REVISION", "GPUS", "SCALED", "ROLLOUT"]
    assert row.split()[:7] == ["web", "ml", "default", "1/2", "2", "3", "5"]      # 2 + 2x1 + 1; web-5 pending
    assert "requests_in_flight 20..." in row and row.endswith("rolling out revision 3: 1 of 2 updated, 1 ready")
    assert asked and asked[0][0] == "ml" and types_pb2.JOB_PHASE_PENDING not in asked[0][2]
    [data] = json.loads(run("top", "services", "-o", "json").output)
    assert data["gpus_allocated"] == 5 and data["scaled_reason"].startswith("requests_in_flight")


def test_a_short_reason_is_kept_and_a_long_one_cut():
    assert services.short("") == "-" and services.short("applied") == "applied"
    assert services.short("x" * 30, 10) == "xxxxxxx..."
