"""Identity and permissions on the API, with real service processes serving TLS on
loopback (docs/reference/security.md): who may submit, cancel, see and cordon what, and that a
denied call writes nothing to the log."""
from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
import pytest
from cryptography.hazmat.primitives import serialization
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gpusched.adapters.log import codec

from gpusched.adapters.broker import dev_pki
from gpusched.client import NO_RETRY, Client, ClientTls, spec
from gpusched.local_cluster import BIN, LocalCluster
from gpusched.v1 import admission_pb2, cluster_pb2, types_pb2
from tests.integration.logcheck import read_log

BINDINGS = [
    {"principal": "alice", "role": "member", "team": "team-a"},
    {"principal": "bob", "role": "member", "team": "team-b"},
    {"principal": "ops", "role": "operator"},
    {"principal": "viewer", "role": "read-only"},
    {"principal": "carol", "role": "member", "team": "team-a"},
    {"principal": "bob2", "role": "member", "team": "team-b"},
    {"principal": "lead-b", "role": "team-admin", "team": "team-b"},
]
DENIED, UNAUTHENTICATED = grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED


@pytest.fixture
async def secured(kafka_bootstrap, topics, tmp_path):
    pki = dev_pki.write(tmp_path / "pki", BINDINGS, client_certs=("carol",))
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path / "logs", pki=pki)
    admission = await cluster.admission()
    await cluster.placer()
    await cluster.agent("node-0", "8xA100-80GB")
    tls = ClientTls.from_files(pki.ca)
    target = f"127.0.0.1:{admission.port}"
    clients = {p: Client(target, tls, pki.tokens[p]) for p in pki.tokens}
    yield cluster, pki, target, clients
    for client in clients.values():
        await client.close()
    await cluster.stop_all()


async def _status(call) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value.code(), info.value.details()


async def _events(kafka_bootstrap, topics) -> list:
    return [codec.decode(v)[0] for records in (await read_log(kafka_bootstrap, topics)).values() for _, v in records]


# What the API writes; placer and agents append placements and reports meanwhile.
API_EVENTS = ("JobSubmitted", "JobCancelled", "NodeCordoned", "NodeUncordoned", "PoolTimeLimitsSet",
              "PoolTopologySet")


async def _api_events(kafka_bootstrap, topics) -> list:
    return [e for e in await _events(kafka_bootstrap, topics) if type(e).__name__ in API_EVENTS]


async def test_a_member_cannot_act_for_another_team_and_nothing_is_written(secured, kafka_bootstrap, topics):
    cluster, pki, target, c = secured
    theirs = (await c["bob"].submit(spec("b-job", "team-b", gpus=1, duration=60))).job
    mine = (await c["alice"].submit(spec("a-job", "", gpus=1, duration=60))).job
    assert mine.spec.team == "team-a"                     # the team is the principal's
    before = await _api_events(kafka_bootstrap, topics)

    code, message = await _status(c["alice"].submit(spec("as-b", "team-b", gpus=1)))
    assert code == DENIED and "alice" in message and "team-b" in message and "spec.team" in message
    batch = [(spec("ok", "team-a", gpus=1), ""), (spec("as-b", "team-b", gpus=1), "")]
    code, message = await _status(c["alice"].submit_many(batch))
    assert code == DENIED and "jobs[1]" in message
    code, message = await _status(c["alice"].jobs.CancelJob(admission_pb2.CancelJobRequest(job_id=theirs.job_id)))
    assert code == DENIED and "alice" in message and "cancel" in message
    code, _ = await _status(c["alice"].get(theirs.job_id))
    assert code == DENIED
    code, _ = await _status(c["alice"].list_all(team="team-b"))
    assert code == DENIED
    assert {j.job_id for j in await c["alice"].list_all()} == {mine.job_id}
    code, message = await _status(c["alice"].cluster.CordonNode(cluster_pb2.CordonNodeRequest(name="node-0")))
    assert code == DENIED and "alice" in message and "nodes.write" in message
    limits = cluster_pb2.SetPoolTimeLimitsRequest(pool="default", max_time_limit={"seconds": 60})
    code, _ = await _status(c["alice"].cluster.SetPoolTimeLimits(limits))
    assert code == DENIED
    code, message = await _status(c["alice"].set_pool_topology("default", ["spine", "rack", "block"]))
    assert code == DENIED and "alice" in message and "pools.write" in message

    assert await _api_events(kafka_bootstrap, topics) == before   # no denied call wrote anything
    await _watch_sees_only_own_team(c)


async def _watch_sees_only_own_team(c) -> None:
    """WatchJobs: alice's stream never carries team-b's jobs, neither the current state
    nor changes (bob's submission is folded before alice's second one: same partition)."""
    stream = c["alice"].jobs.WatchJobs(admission_pb2.WatchJobsRequest())
    await c["bob"].submit(spec("b-2", "team-b", gpus=1, duration=60))
    second = (await c["alice"].submit(spec("a-2", "team-a", gpus=1, duration=60))).job
    seen = []
    async for update in stream:
        seen.append(update.job.spec.team)
        if update.job.job_id == second.job_id:
            break
    stream.cancel()
    assert set(seen) == {"team-a"}


async def test_an_operator_can_and_is_recorded(secured, kafka_bootstrap, topics):
    cluster, pki, target, c = secured
    job = (await c["bob"].submit(spec("b-job", "team-b", gpus=1, duration=60))).job
    for_b = (await c["ops"].submit(spec("ops-for-b", "team-b", gpus=1, duration=60))).job
    assert for_b.spec.team == "team-b"
    cancelled = await c["ops"].jobs.CancelJob(admission_pb2.CancelJobRequest(job_id=job.job_id))
    assert cancelled.phase in (types_pb2.JOB_PHASE_CANCELLED, types_pb2.JOB_PHASE_STOPPING)   # running: stops first
    node = await c["ops"].cluster.CordonNode(cluster_pb2.CordonNodeRequest(name="node-0"))
    assert node.status == types_pb2.NODE_STATUS_CORDONED
    await c["ops"].cluster.UncordonNode(cluster_pb2.UncordonNodeRequest(name="node-0"))
    await c["ops"].cluster.SetPoolTimeLimits(cluster_pb2.SetPoolTimeLimitsRequest(pool="default",
                                                                                 max_time_limit={"seconds": 3600}))
    assert (await c["ops"].set_pool_topology("default", ["rack", "block"])).topology_levels == ["rack", "block"]
    who = {(type(e).__name__, getattr(e, "principal", None)) for e in await _events(kafka_bootstrap, topics)}
    assert {("JobSubmitted", "bob"), ("JobSubmitted", "ops"), ("JobCancelled", "ops"), ("NodeCordoned", "ops"),
            ("NodeUncordoned", "ops"), ("PoolTimeLimitsSet", "ops"), ("PoolTopologySet", "ops")} <= who


async def test_a_member_cancels_its_own_jobs_a_team_admin_any_of_the_team(secured):
    _, _, _, c = secured
    own = (await c["bob"].submit(spec("b-own", "team-b", gpus=1, duration=60))).job
    await c["bob"].jobs.CancelJob(admission_pb2.CancelJobRequest(job_id=own.job_id))
    other = (await c["bob"].submit(spec("b-other", "team-b", gpus=1, duration=60))).job
    code, message = await _status(c["bob2"].jobs.CancelJob(admission_pb2.CancelJobRequest(job_id=other.job_id)))
    assert code == DENIED and "bob2" in message and "submitted" in message
    assert {j.job_id for j in await c["bob2"].list_all()} >= {own.job_id, other.job_id}   # sees them
    await c["lead-b"].jobs.CancelJob(admission_pb2.CancelJobRequest(job_id=other.job_id))


async def test_read_only_sees_everything_and_writes_nothing(secured):
    _, _, _, c = secured
    a = (await c["alice"].submit(spec("a", "team-a", gpus=1, duration=60))).job
    b = (await c["bob"].submit(spec("b", "team-b", gpus=1, duration=60))).job
    assert {a.job_id, b.job_id} <= {j.job_id for j in await c["viewer"].list_all()}
    assert (await c["viewer"].get(b.job_id)).job_id == b.job_id
    assert len(await c["viewer"].nodes()) == 1
    code, message = await _status(c["viewer"].submit(spec("v", "team-a", gpus=1)))
    assert code == DENIED and "viewer" in message
    code, _ = await _status(c["viewer"].jobs.CancelJob(admission_pb2.CancelJobRequest(job_id=a.job_id)))
    assert code == DENIED


def _jwt(pki, **claims) -> str:
    key = serialization.load_pem_private_key(Path(pki.jwt_key).read_bytes(), password=None)
    return dev_pki.sign_jwt(key, {"sub": "alice", "exp": int(time.time()) + 300, **claims})


async def test_credentials_missing_bad_or_expired_are_unauthenticated(secured):
    _, pki, target, c = secured
    tls = ClientTls.from_files(pki.ca)
    other_key, _ = dev_pki.jwt_keypair()
    bad = {
        "none": "", "unknown static token": "not-a-token",
        "expired JWT": _jwt(pki, exp=int(time.time()) - 60),
        "JWT of another key": dev_pki.sign_jwt(other_key, {"sub": "ops", "exp": int(time.time()) + 300}),
        "JWT without exp": dev_pki.sign_jwt(
            serialization.load_pem_private_key(Path(pki.jwt_key).read_bytes(), None), {"sub": "ops"}),
    }
    for what, token in bad.items():
        client = Client(target, tls, token)
        code, _ = await _status(client.list_all())
        assert code == UNAUTHENTICATED, what
        code, _ = await _status(client.submit(spec("x", "team-a", gpus=1)))
        assert code == UNAUTHENTICATED, what
        await client.close()
    # a valid JWT names its principal; health needs no identity
    client = Client(target, tls, _jwt(pki))
    job = (await client.submit(spec("by-jwt", "", gpus=1, duration=1))).job
    assert job.spec.team == "team-a"
    health = health_pb2_grpc.HealthStub(client.channel)
    assert (await health.Check(health_pb2.HealthCheckRequest())).status == health_pb2.HealthCheckResponse.SERVING
    await client.close()


async def test_mutual_tls_identifies_the_principal(secured, kafka_bootstrap, topics, tmp_path):
    _, pki, _, c = secured
    mtls = LocalCluster(kafka_bootstrap, topics, tmp_path / "mtls-logs", pki=pki, mtls=True)
    try:
        admission = await mtls.admission("admission-mtls")
        target = f"127.0.0.1:{admission.port}"
        cert, key = pki.client_cert("carol")
        carol = Client(target, ClientTls.from_files(pki.ca, cert, key))
        job = (await carol.submit(spec("by-cert", "", gpus=1, duration=1))).job
        assert job.spec.team == "team-a"
        code, message = await _status(carol.submit(spec("as-b", "team-b", gpus=1)))
        assert code == DENIED and "carol" in message
        await carol.close()
        # without a client certificate the TLS handshake fails: no call reaches a handler
        no_cert = Client(target, ClientTls.from_files(pki.ca), pki.tokens["ops"], retry=NO_RETRY)
        code, _ = await _status(no_cert.list_all())
        assert code == grpc.StatusCode.UNAVAILABLE
        await no_cert.close()
    finally:
        await mtls.stop_all()


@pytest.mark.parametrize("listen", ["0.0.0.0:0", "[::]:0", "10.1.2.3:0"])
async def test_insecure_refuses_a_non_loopback_address(listen):
    proc = await asyncio.create_subprocess_exec(
        str(BIN / "gpusched-admission"), "--insecure", "--listen", listen, "--bootstrap", "127.0.0.1:1",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode != 0
    assert b"--insecure" in err and b"loopback" in err and listen.encode() in err


async def test_a_server_without_tls_settings_refuses_to_start():
    proc = await asyncio.create_subprocess_exec(
        str(BIN / "gpusched-placer"), "--listen", "127.0.0.1:0", "--bootstrap", "127.0.0.1:1",
        env={"PATH": "/usr/bin:/bin"}, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode != 0 and b"--tls-cert" in err
