"""The attacks a secured cluster must hold against, kept as tests: a stranger, a member of
another team, a member who would pin a GPU, and a compromised node, against real service
processes serving TLS (docs/reference/security.md) on the secured broker (docs/reference/kafka-security.md),
with a node-agent that runs its workers as real processes."""
from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import TopicAuthorizationFailedError
from cryptography.hazmat.primitives import serialization
from google.protobuf import message_factory
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gpusched.adapters.log import codec

from gpusched.adapters.broker import dev_pki
from gpusched.adapters.broker.kafka_security import client_args
from gpusched.adapters.log.publisher import partition_for
from gpusched.adapters.nodes.reports import node_principal, report_topic
from gpusched.adapters.nodes.work_view import work_topic
from gpusched.client import Client, ClientTls, spec
from gpusched.core import events as ev
from gpusched.local_cluster import LocalCluster
from gpusched.v1 import admission_pb2, cluster_pb2, node_agent_pb2, types_pb2
from tests.integration.logcheck import dead_letters, read_log
from tests.unit.core.builders import make_spec

BINDINGS = [
    {"principal": "alice", "role": "member", "team": "team-a"},
    {"principal": "bob", "role": "member", "team": "team-b"},
    {"principal": "lead-b", "role": "team-admin", "team": "team-b"},
    {"principal": "ops", "role": "operator"},
]
DENIED, UNAUTHENTICATED, INVALID = (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED,
                                    grpc.StatusCode.INVALID_ARGUMENT)
NODE = "node-0"
API_EVENTS = ("JobSubmitted", "JobCancelled", "NodeCordoned", "NodeUncordoned", "PoolTimeLimitsSet", "PoolCreated",
              "QuotaSet", "TeamPolicySet", "PoolTopologySet")


@pytest.fixture
async def secured(kafka_bootstrap, topics, tmp_path):
    if not kafka_bootstrap.secured:
        pytest.skip("the broker's ACLs are part of what this checks: the test broker is plaintext")
    pki = dev_pki.write(tmp_path / "pki", BINDINGS)
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path / "logs", pki=pki)
    admission = await cluster.admission()
    await cluster.placer()
    agent = await cluster.agent(NODE, "1xH100-80GB", "--run-processes", "--state-dir", str(tmp_path / NODE),
                                "--grace", "1")
    tls = ClientTls.from_files(pki.ca)
    target = f"127.0.0.1:{admission.port}"
    clients = {p: Client(target, tls, pki.tokens[p]) for p in pki.tokens}
    yield cluster, pki, target, clients, agent
    for client in clients.values():
        await client.close()
    await cluster.stop_all()


async def _status(call) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value.code(), info.value.details()


async def _api_events(kafka_bootstrap, topics) -> list:
    return [e for records in (await read_log(kafka_bootstrap, topics)).values() for _, v in records
            if type(e := codec.decode(v)[0]).__name__ in API_EVENTS]


def _every_rpc(channel: grpc.aio.Channel, module, service: str):
    """(name, call) for every RPC of ``service``, each asked with an empty request."""
    for method in module.DESCRIPTOR.services_by_name[service].methods:
        request = message_factory.GetMessageClass(method.input_type)()
        reply = message_factory.GetMessageClass(method.output_type)
        path = f"/gpusched.v1.{service}/{method.name}"
        if method.server_streaming:
            stream = channel.unary_stream(path, request_serializer=type(request).SerializeToString,
                                          response_deserializer=reply.FromString)
            yield path, stream(request, timeout=30).read()
        else:
            unary = channel.unary_unary(path, request_serializer=type(request).SerializeToString,
                                        response_deserializer=reply.FromString)
            yield path, unary(request, timeout=30)


async def test_a_stranger_is_refused_every_rpc_and_writes_nothing(secured, kafka_bootstrap, topics):
    """No credentials: UNAUTHENTICATED; a valid identity bound to no role: PERMISSION_DENIED;
    every RPC of admission and of the node-agent, found from the protos."""
    cluster, pki, target, _, agent = secured
    before = await _api_events(kafka_bootstrap, topics)
    tls = ClientTls.from_files(pki.ca)
    key = serialization.load_pem_private_key(Path(pki.jwt_key).read_bytes(), password=None)
    unbound = dev_pki.sign_jwt(key, {"sub": "mallory", "exp": int(time.time()) + 300})   # valid, bound to no role
    for token, expected in (("", UNAUTHENTICATED), ("not-a-token", UNAUTHENTICATED), (unbound, DENIED)):
        for where, services in ((target, ((admission_pb2, "AdmissionService"), (cluster_pb2, "ClusterService"))),
                                (f"127.0.0.1:{agent.port}", ((node_agent_pb2, "NodeAgentService"),))):
            client = Client(where, tls, token)
            for module, service in services:
                for path, call in _every_rpc(client.channel, module, service):
                    code, details = await _status(call)
                    assert code == expected, (path, token[:8], code, details)
            health = health_pb2_grpc.HealthStub(client.channel)   # health needs no identity
            assert (await health.Check(health_pb2.HealthCheckRequest())).status == \
                health_pb2.HealthCheckResponse.SERVING
            await client.close()
    assert await _api_events(kafka_bootstrap, topics) == before


async def test_a_member_of_another_team_cannot_see_watch_cancel_or_set_its_quota(secured, kafka_bootstrap, topics):
    _, _, _, c, _ = secured
    await c["ops"].set_quota(cluster_pb2.SetQuotaRequest(org="ml", guaranteed_gpus=8, limit_gpus=12))
    for team in ("team-a", "team-b"):
        await c["ops"].set_quota(cluster_pb2.SetQuotaRequest(org="ml", team=team, guaranteed_gpus=2, limit_gpus=4))
    theirs = (await c["alice"].submit(spec("a-job", "team-a", gpus=1, duration=600))).job
    before = await _api_events(kafka_bootstrap, topics)

    code, message = await _status(c["bob"].get(theirs.job_id))
    assert code == DENIED and "bob" in message
    # a watch of their job is refused as GetJob is, at once: not an empty stream that hangs
    stream = c["bob"].jobs.WatchJobs(admission_pb2.WatchJobsRequest(job_id=theirs.job_id))
    code, message = await _status(asyncio.wait_for(stream.read(), 30))
    assert code == DENIED and "bob" in message and theirs.job_id in message
    code, _ = await _status(c["bob"].jobs.CancelJob(admission_pb2.CancelJobRequest(job_id=theirs.job_id)))
    assert code == DENIED
    code, _ = await _status(c["bob"].list_all(team="team-a"))
    assert code == DENIED
    code, message = await _status(c["bob"].submit(spec("as-a", "team-a", gpus=1)))
    assert code == DENIED and "spec.team" in message
    for who in ("bob", "lead-b"):   # a member sets no quota; a team admin not another team's
        code, message = await _status(c[who].set_quota(
            cluster_pb2.SetQuotaRequest(org="ml", team="team-a", guaranteed_gpus=0, limit_gpus=0)))
        assert code == DENIED and who in message, message
    for call in (c["lead-b"].set_team_policy(cluster_pb2.SetTeamPolicyRequest(team="team-a", pools=["nowhere"])),
                 c["lead-b"].cluster.CreatePool(cluster_pb2.CreatePoolRequest(pool="mine")),
                 c["lead-b"].cluster.CordonNode(cluster_pb2.CordonNodeRequest(name=NODE))):
        code, _ = await _status(call)
        assert code == DENIED
    assert await _api_events(kafka_bootstrap, topics) == before   # no denied call wrote anything
    assert (await c["alice"].get(theirs.job_id)).phase != types_pb2.JOB_PHASE_CANCELLED


async def test_a_team_admin_sets_its_teams_quota_within_its_orgs(secured):
    _, _, _, c, _ = secured
    await c["ops"].set_quota(cluster_pb2.SetQuotaRequest(org="ml", guaranteed_gpus=8, limit_gpus=12))
    await c["ops"].set_quota(cluster_pb2.SetQuotaRequest(org="ml", team="team-a", guaranteed_gpus=2, limit_gpus=4))
    await c["ops"].set_quota(cluster_pb2.SetQuotaRequest(org="ml", team="team-b", guaranteed_gpus=2, limit_gpus=4))

    view = await c["lead-b"].set_quota(cluster_pb2.SetQuotaRequest(org="ml", team="team-b", guaranteed_gpus=6,
                                                                   limit_gpus=12, borrowing=False))
    [quota] = [q for q in view.quotas if q.team == "team-b"]
    assert (quota.guaranteed_gpus, quota.limit_gpus, quota.borrowing) == (6, 12, False)
    for request, field in ((cluster_pb2.SetQuotaRequest(org="ml", team="team-b", guaranteed_gpus=6.5,
                                                        limit_gpus=12), "guaranteed_gpus"),   # 6.5 + team-a's 2 > 8
                           (cluster_pb2.SetQuotaRequest(org="ml", team="team-b", guaranteed_gpus=1,
                                                        limit_gpus=13), "limit_gpus"),
                           (cluster_pb2.SetQuotaRequest(org="other", team="team-b", guaranteed_gpus=1), "org"),
                           (cluster_pb2.SetQuotaRequest(org="ml", guaranteed_gpus=100), "team")):
        code, message = await _status(c["lead-b"].set_quota(request))
        assert code == DENIED and message.startswith(f"{field}:"), message
    assert [q.guaranteed_gpus for q in (await c["bob"].policy()).quotas if q.team == "team-b"] == [6]


async def test_a_member_cannot_pin_a_gpu_with_what_no_process_can_start(secured, kafka_bootstrap, topics):
    _, _, _, c, _ = secured
    # refused at admission, naming the argument
    code, message = await _status(c["alice"].submit(spec("nul", "", gpus=1, command=("echo", "a\x00b"))))
    assert code == INVALID and message.startswith("spec.command[1]: must not contain a NUL byte"), message

    # written around admission (a login that may write the pool log): the fold refuses it too
    forged = ev.JobSubmitted(event_id="forged-nul", time=time.time(), producer="forger", job_id="forged-nul",
                             spec=replace(make_spec(gpus=1, team="team-a"), command=("echo", "a\x00b")))
    producer = AIOKafkaProducer(**client_args(kafka_bootstrap), acks="all")
    await producer.start()
    try:
        await producer.send_and_wait(topics.events, codec.encode(forged, "default"), key=b"default",
                                     partition=partition_for("default", 4))
    finally:
        await producer.stop()

    # A workload's own checkpoint may name what no process can be given (GPUSCHED_RESUME_FROM):
    # the next attempt cannot start, and that ends it with the reason instead of pinning the GPU.
    planted = spec("planted", "", gpus=1, command=(
        "sh", "-c", "printf 'plan\\000b 1' > \"$GPUSCHED_CHECKPOINT_FILE\"; exit 3"))
    planted.max_restarts = 1
    job = (await c["alice"].submit(planted)).job.job_id
    (ended,) = await c["alice"].wait_terminal({job}, timeout=120)
    assert ended.phase == types_pb2.JOB_PHASE_FAILED, (ended.phase, ended.reason)
    assert ended.checkpoint == "plan\x00b" and "cannot start" in ended.reason, ended.reason
    after = (await c["alice"].submit(spec("after", "", gpus=1, command=("true",)))).job.job_id
    (done,) = await c["alice"].wait_terminal({after}, timeout=120)
    assert done.phase == types_pb2.JOB_PHASE_SUCCEEDED   # the node's one GPU is free again
    # folded before these jobs (the same partition): no job came of the forged record
    code, _ = await _status(c["ops"].get(forged.job_id))
    assert code == grpc.StatusCode.NOT_FOUND


async def test_a_compromised_node_reads_no_teams_jobs_and_forges_nothing(secured, kafka_bootstrap, topics):
    """With a node's Kafka login: the pool log (every team's specs, commands, submitters)
    is not readable, nor is another node's work view; the pool log is not writable; what
    it forges on its own report topic is dead-lettered with the reason."""
    cluster, _, _, c, _ = secured
    await cluster.add_node("node-9")   # another node's topics exist
    job = (await c["alice"].submit(spec("secret", "", gpus=1, command=("sleep", "600")))).job.job_id
    login = kafka_bootstrap.as_user(node_principal(NODE), cluster.credentials[node_principal(NODE)])
    for topic in (topics.events, work_topic(topics.prefix, "node-9"), topics.usage, topics.snapshots):
        assert not await _readable(login, topic), topic
    assert await _readable(login, work_topic(topics.prefix, NODE))   # its own work view it reads
    producer = AIOKafkaProducer(**client_args(login), acks="all", enable_idempotence=True)
    await producer.start()
    try:
        with pytest.raises(TopicAuthorizationFailedError):
            await producer.send_and_wait(topics.events, b"forged", key=b"default")
        forged = ev.JobCancelled(event_id="forged-cancel", time=time.time(), producer="node", job_id=job,
                                 reason="forged")
        own = report_topic(topics.prefix, NODE)
        sent = await producer.send_and_wait(own, codec.encode(forged, "default"), key=b"default")
    finally:
        await producer.stop()
    letters = await dead_letters(kafka_bootstrap, topics, own, 1)
    assert "JobCancelled is not an event a node-agent reports" in letters.get(sent.offset, ""), letters
    assert (await c["alice"].get(job)).phase != types_pb2.JOB_PHASE_CANCELLED


async def _readable(conn, topic: str) -> bool:
    """Whether ``conn`` may fetch ``topic`` (what READ guards); a topic it may not even
    describe is not listed to it."""
    consumer = AIOKafkaConsumer(**client_args(conn), enable_auto_commit=False, request_timeout_ms=10_000)
    await consumer.start()
    try:
        if topic not in await consumer.topics():
            return False
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        await consumer.getmany(tp, timeout_ms=2000)
        return True
    except TopicAuthorizationFailedError:
        return False
    finally:
        await consumer.stop()
