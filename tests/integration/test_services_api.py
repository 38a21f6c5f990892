"""The services API (ServiceApi) on a real broker with admission, a placer and a simulated
node: apply makes the replicas as jobs, scale changes their count, a changed template is a
new revision and a rollback makes the earlier one current again, WatchEndpoints sends the
ready list at each change (a readiness report written as a node-agent would) and ends
when the service is deleted, which cancels the replicas. Bad specs are refused naming the
field and write nothing; an unknown service is NOT_FOUND; another team's service is
PERMISSION_DENIED on a secured cluster. Then the same through the commands."""
from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from gpusched.adapters.broker import dev_pki
from gpusched.core import events as ev
from gpusched.client import Client, ClientTls, spec
from gpusched.local_cluster import LocalCluster
from gpusched.v1 import types_pb2
from tests.integration.cli_runs import Cli, rows
from tests.integration.cluster_calls import until
from tests.integration.logcheck import read_log
from tests.polling import eventually_async
from gpusched.adapters.log import codec

TERMINAL = {types_pb2.JOB_PHASE_CANCELLED, types_pb2.JOB_PHASE_SUCCEEDED, types_pb2.JOB_PHASE_FAILED}
SERVICE_EVENTS = ("ServiceApplied", "ServiceScaled", "ServiceDeleted")


def web(replicas: int = 2, command: str = "serve-v1") -> types_pb2.ServiceSpec:
    template = spec("", "", gpus=1, command=(command,), duration=3600)   # runs until stopped
    msg = types_pb2.ServiceSpec(name="web", team="ml", template=template, max_replicas=4)
    msg.replicas = replicas
    return msg


async def _service_events(kafka_bootstrap, topics) -> list:
    return [e for records in (await read_log(kafka_bootstrap, topics)).values() for _, v in records if v
            for e in [codec.decode(v)[0]] if type(e).__name__ in SERVICE_EVENTS]


async def _replicas(client: Client, name: str) -> list[types_pb2.Job]:
    return [j for j in await client.list_all() if j.spec.name == name and j.phase not in TERMINAL]


async def _refused(call) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    return err.value.code(), err.value.details()


async def test_apply_scale_update_rollback_delete(kafka_bootstrap, topics, tmp_path):
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path / "logs")
    try:
        admission = await cluster.admission()
        await cluster.placer()
        await cluster.agent("node-0", "8xA100-80GB")
        client = Client(f"127.0.0.1:{admission.port}")
        await eventually_async(lambda: _has_pool(client), "the node's pool is known", 30)

        made = await client.apply_service(web())
        assert (made.spec.name, made.spec.team, made.desired, made.revision, made.replicas) == ("web", "ml", 2, 1, 2)
        assert made.spec.priority_class == "production-inference" and not made.spec.preemptible
        assert made.spec.min_replicas == 1 and made.spec.update.max_surge == 1
        jobs = await _replicas(client, "web")
        assert sorted(j.job_id for j in jobs) == sorted(r.job_id for r in made.replica)
        assert all(j.job_id.startswith("web-") and j.spec.kind == types_pb2.JOB_KIND_INFERENCE for j in jobs)
        assert {j.phase for j in jobs} <= {types_pb2.JOB_PHASE_PENDING, types_pb2.JOB_PHASE_PLACED,
                                           types_pb2.JOB_PHASE_RUNNING}
        assert (await client.get_service("web")).replicas == 2
        assert [s.spec.name for s in await client.list_services(team="ml")] == ["web"]
        assert await client.list_services(team="other") == []

        scaled = await client.scale_service("web", 3)
        assert (scaled.desired, scaled.replicas, scaled.scaled_reason) == (3, 3, "scaled by user")
        assert len(await _replicas(client, "web")) == 3

        changed = await client.apply_service(web(replicas=3, command="serve-v2"))
        assert changed.revision == 2 and changed.revisions == [1, 2]
        assert changed.spec.template.command == ["serve-v2"] and changed.desired == 3
        assert not changed.rollout_done and changed.rollout.startswith("rolling out revision 2")

        back = await client.rollback_service("web", 1)
        assert back.revision == 3 and back.spec.template.command == ["serve-v1"]
        assert back.revisions == [2, 3]          # revision 1's template is current again, as 3

        watch = client.watch_endpoints("web")
        first = await anext(watch)
        assert first.service == "web" and not first.deleted
        # a simulated replica is ready once it runs, as its agent reports one without a check
        latest = first
        while not (len(latest.endpoints) == 3 and {e.revision for e in latest.endpoints} == {3}):
            latest = await asyncio.wait_for(anext(watch), 60)
        assert all(e.address and e.port == 0 for e in latest.endpoints)      # no port declared
        view = await client.get_service("web")
        assert view.ready == 3 and {r.job_id for r in view.replica if r.ready} == {e.replica for e in latest.endpoints}
        gone = await client.delete_service("web")
        assert gone.spec.name == "web"
        last = await asyncio.wait_for(anext(watch), 30)
        assert last.deleted and last.service == "web"
        await watch.aclose()
        code, message = await _refused(client.get_service("web"))
        assert code == grpc.StatusCode.NOT_FOUND and "web" in message

        async def all_stopped() -> bool:
            return not await _replicas(client, "web")
        await eventually_async(all_stopped, "every replica cancelled", 60)
        cancelled = [j for j in await client.list_all() if j.spec.name == "web"]
        assert cancelled and {j.phase for j in cancelled} == {types_pb2.JOB_PHASE_CANCELLED}
        await client.close()
    finally:
        await cluster.stop_all()


async def _has_pool(client: Client) -> bool:
    try:
        return (await client.summary("default")).nodes == 1
    except grpc.aio.AioRpcError:
        return False


def _bad_specs() -> list[tuple[types_pb2.ServiceSpec, str]]:
    above = web(replicas=2)
    above.min_replicas, above.max_replicas = 3, 2
    negative = web()
    negative.replicas = -1
    http_without_port = web()
    http_without_port.template.readiness.http_path = "/healthz"
    unknown_metric = web()
    unknown_metric.autoscaling.metric = 17
    no_max = web()
    no_max.max_replicas = 0
    no_max.autoscaling.metric, no_max.autoscaling.target = types_pb2.SCALING_METRIC_REQUESTS_IN_FLIGHT, 8
    too_big = web()
    too_big.template.resources.gpus = 16
    return [(above, "spec.min_replicas: 3 is above max_replicas 2"), (negative, "spec.replicas"),
            (too_big, "spec.template.resources.gpus"),
            (http_without_port, "spec.template.readiness.http_path"), (unknown_metric, "spec.autoscaling.metric"),
            (no_max, "spec.max_replicas")]


async def test_bad_requests_are_refused_naming_the_field_and_write_nothing(kafka_bootstrap, topics, tmp_path):
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path / "logs")
    try:
        admission = await cluster.admission()
        await cluster.agent("node-0", "8xA100-80GB")
        client = Client(f"127.0.0.1:{admission.port}")
        await eventually_async(lambda: _has_pool(client), "the node's pool is known", 30)
        for bad, named in _bad_specs():
            code, message = await _refused(client.apply_service(bad))
            assert code == grpc.StatusCode.INVALID_ARGUMENT and named in message, (named, message)
        job = spec("plain", "ml", gpus=1)
        job.readiness.http_path = "/healthz"
        code, message = await _refused(client.submit(job))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "spec.readiness" in message
        assert await _service_events(kafka_bootstrap, topics) == []
        assert await client.list_services() == []

        await client.apply_service(web(replicas=2))
        written = len(await _service_events(kafka_bootstrap, topics))
        for call, named in ((client.scale_service("web", 5), "replicas: 5 is outside"),
                            (client.scale_service("web", 0), "replicas: 0 is outside"),
                            (client.rollback_service("web", 7), "revision"),
                            (client.rollback_service("web"), "revision")):
            code, message = await _refused(call)
            assert code == grpc.StatusCode.INVALID_ARGUMENT and message.startswith(named), (named, message)
        for call in (client.get_service("nope"), client.scale_service("nope", 1), client.delete_service("nope"),
                     client.rollback_service("nope")):
            code, message = await _refused(call)
            assert code == grpc.StatusCode.NOT_FOUND and "nope" in message
        assert len(await _service_events(kafka_bootstrap, topics)) == written
        assert (await client.get_service("web")).desired == 2
        await client.close()
    finally:
        await cluster.stop_all()


async def test_another_teams_service_is_denied_and_nothing_is_written(kafka_bootstrap, topics, tmp_path):
    bindings = [{"principal": "alice", "role": "member", "team": "team-a"},
                {"principal": "bob", "role": "member", "team": "ml"}]
    pki = dev_pki.write(tmp_path / "pki", bindings)
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path / "logs", pki=pki)
    try:
        admission = await cluster.admission()
        await cluster.agent("node-0", "8xA100-80GB")
        target, tls = f"127.0.0.1:{admission.port}", ClientTls.from_files(pki.ca)
        alice, bob = Client(target, tls, pki.tokens["alice"]), Client(target, tls, pki.tokens["bob"])
        await eventually_async(lambda: _has_pool(bob), "the node's pool is known", 30)
        await bob.apply_service(web())
        written = len(await _service_events(kafka_bootstrap, topics))
        as_own_team = web()
        as_own_team.team = "team-a"
        for call, field in ((alice.apply_service(web()), "spec.team"), (alice.apply_service(as_own_team), "spec.name"),
                            (alice.scale_service("web", 3), "name"),
                            (alice.rollback_service("web"), "name"), (alice.delete_service("web"), "name"),
                            (alice.get_service("web"), "name")):
            code, message = await _refused(call)
            assert code == grpc.StatusCode.PERMISSION_DENIED and message.startswith(field) and "alice" in message
        code, _ = await _refused(alice.list_services(team="ml"))
        assert code == grpc.StatusCode.PERMISSION_DENIED
        assert await alice.list_services() == []                  # bob's service is not listed to alice
        assert len(await _service_events(kafka_bootstrap, topics)) == written
        assert (await bob.get_service("web")).desired == 2
        await alice.close()
        await bob.close()
    finally:
        await cluster.stop_all()


SERVICE_FILE = """\
kind: Service
name: chat
team: ml
replicas: 2
max_replicas: 3
template:
  resources: {gpus: 1}
  command: [serve]
  simulated_duration: 1h
"""


async def test_the_service_commands(kafka_bootstrap, topics, tmp_path):
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path / "logs")
    try:
        admission = await cluster.admission()
        await cluster.placer()
        await cluster.agent("node-0", "8xA100-80GB")
        client = Client(f"127.0.0.1:{admission.port}")
        await eventually_async(lambda: _has_pool(client), "the node's pool is known", 30)
        cli = Cli(admission.port, tmp_path)
        path = tmp_path / "chat.yaml"
        path.write_text(SERVICE_FILE)
        assert await cli.run("apply", "-f", str(path)) == "service/chat applied (revision 1, 2 replicas)\n"
        [row] = rows(await cli.run("get", "services"))
        assert (row["NAME"], row["TEAM"], row["UP-TO-DATE"], row["REVISION"]) == ("chat", "ml", "2", "1")
        assert row["READY"] in ("0/2", "1/2", "2/2")        # simulated replicas are ready once they run
        assert await cli.run("scale", "chat", "--replicas", "3") == "service/chat scaled to 3\n"
        refused = await cli.run("scale", "chat", "--replicas", "4", ok=False)
        assert refused.startswith("Error: INVALID_ARGUMENT: replicas: 4 is outside"), refused
        # revision 2 asks a whole node per replica: it cannot be placed while the 3 old
        # replicas hold their GPUs, and the rollout (max_unavailable 0) stalls on it
        path.write_text(SERVICE_FILE.replace("[serve]", "[serve, --v2]").replace("{gpus: 1}", "{gpus: 8}"))
        assert "(revision 2, 3 replicas)" in await cli.run("apply", "-f", str(path))
        described = await cli.run("describe", "service", "chat")
        assert "Revision:     2 (kept: 1, 2)" in described and "Command:      serve --v2" in described
        assert "Rollout:      rolling out revision 2" in described
        assert len([line for line in described.splitlines() if line.startswith("  chat-")]) >= 4
        late = await cli.run("rollout", "status", "chat", "--timeout", "1s", ok=False)
        assert "timed out after 1s" in late, late
        assert await cli.run("rollout", "undo", "chat") == "service/chat rolled back (now revision 3)\n"
        assert (await client.get_service("chat")).spec.template.command == ["serve"]
        assert "complete" in await cli.run("rollout", "status", "chat", "--timeout", "60s")
        endpoints = (await cli.run("get", "endpoints", "chat")).splitlines()
        assert len(endpoints) == 3 and all(line.split()[2] == "3" for line in endpoints)   # revision 3's
        assert "service/chat deleted" in await cli.run("delete", "service", "chat")
        assert "chat" not in await cli.run("get", "services")
        gone = await cli.run("describe", "service", "chat", ok=False)
        assert gone.startswith("Error: NOT_FOUND: name: no service 'chat'"), gone
        await client.close()
    finally:
        await cluster.stop_all()
