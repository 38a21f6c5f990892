"""Bad input and abuse against a running admission: every client mistake is a status
naming the field (never UNKNOWN with exception text), pools must exist, a forged
``JobSubmitted`` on the topic creates no job, and teams' rate and pending limits hold."""
from __future__ import annotations

import grpc
import pytest
from aiokafka import AIOKafkaProducer

from gpusched.adapters.log import codec
from gpusched.adapters.log.publisher import partition_for
from gpusched.adapters.broker.kafka_security import client_args
from gpusched.client import Client, spec
from gpusched.core import events as ev
from gpusched.core.model import JobSpec, WorkerResources
from gpusched.local_cluster import LocalCluster
from gpusched.v1 import admission_pb2, cluster_pb2

HUGE = "x" * 3_000_000   # above Kafka's 1 MB record, below gRPC's receive limit


@pytest.fixture
async def api(kafka_bootstrap, topics, tmp_path):
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path)
    admission = await cluster.admission()
    await cluster.agent("node-0", "8xA100-80GB")
    client = Client(f"127.0.0.1:{admission.port}")
    await _until_node(client, "node-0")
    yield cluster, client
    await client.close()
    await cluster.stop_all()


async def _until_node(client: Client, name: str) -> None:
    """Admission has folded the node's registration (and so knows its pool)."""
    while True:
        try:
            await client.cluster.GetNode(cluster_pb2.GetNodeRequest(name=name))
            return
        except grpc.aio.AioRpcError as exc:
            assert exc.code() == grpc.StatusCode.NOT_FOUND, exc
            await _folded(client)


async def _folded(client: Client) -> None:
    """One round trip through the log: a pool creation admission waits to fold."""
    await client.cluster.CreatePool(cluster_pb2.CreatePoolRequest(pool="sync"))


async def _status(call) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    return err.value.code(), err.value.details()


def _ok_spec(**changes) -> object:
    s = spec("ok", "team-a", gpus=1, duration=0.1)
    for name, value in changes.items():
        if name == "command":
            s.command.extend(value)
        else:
            setattr(s, name, value)
    return s


async def test_huge_fields_are_invalid_argument_naming_the_field(api):
    _, client = api
    job = (await client.submit(spec("victim", "team-a", gpus=1, duration=60.0))).job
    cases = [
        (client.submit(_ok_spec(command=[HUGE])), "spec.command[0]"),
        (client.submit(_ok_spec(command=["a"] * 5000)), "spec.command"),
        (client.submit(_ok_spec(org=HUGE)), "spec.org"),
        (client.submit(_ok_spec(name=HUGE)), "spec.name"),
        (client.submit(_ok_spec(), key=HUGE), "idempotency_key"),
        (client.jobs.CancelJob(admission_pb2.CancelJobRequest(job_id=job.job_id, reason=HUGE)), "reason"),
        (client.jobs.GetJob(admission_pb2.GetJobRequest(job_id=HUGE)), "job_id"),
        (client.jobs.ListJobs(admission_pb2.ListJobsRequest(page_token=HUGE)), "page_token"),
        (client.cluster.CordonNode(cluster_pb2.CordonNodeRequest(name="node-0", reason=HUGE)), "reason"),
    ]
    for call, field in cases:
        code, details = await _status(call)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith(field + ":"), (field, code, details[:200])
        assert len(details) < 500   # the value is not echoed back
    assert (await client.get(job.job_id)).phase != 0


async def test_a_gang_of_zero_is_refused_and_an_unset_size_is_one(api):
    """proto3 reads an unset int as 0: ``workers`` has presence, so 0 is the caller's."""
    _, client = api
    zero = _ok_spec()
    zero.workers = 0
    code, details = await _status(client.submit(zero))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("spec.workers: must be 1..4096, got 0"), \
        details
    unset = _ok_spec()
    unset.ClearField("workers")
    assert (await client.submit(unset)).job.spec.workers == 1


async def test_undecodable_requests_and_unknown_phases_are_invalid_argument(api):
    _, client = api
    raw = client.channel.unary_unary("/gpusched.v1.AdmissionService/SubmitJob")   # bytes in, bytes out
    inner = b"\x0a\x04\xff\xfe\xfd\xfc"                                              # spec.name: invalid UTF-8
    for payload in (b"\x0a" + bytes([len(inner)]) + inner, b"\xff\xff\xff\xff\x0f", b"\x0a\x7f\x01"):
        code, details = await _status(raw(payload))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("request: not a valid message"), details
    code, details = await _status(client.jobs.ListJobs(admission_pb2.ListJobsRequest(phases=[2, 99])))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("phases[1]: unknown phase 99"), details


async def test_a_job_for_an_unknown_pool_is_refused_until_an_operator_creates_it(api):
    _, client = api
    code, details = await _status(client.submit(_ok_spec(pool="nowhere")))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert details.startswith("spec.pool: no pool 'nowhere'; known pools: default"), details
    code, details = await _status(client.cluster.CreatePool(cluster_pb2.CreatePoolRequest(pool="bad pool")))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("pool:"), details
    summary = await client.cluster.CreatePool(cluster_pb2.CreatePoolRequest(pool="nowhere"))
    assert summary.pool == "nowhere" and summary.nodes == 0
    await client.cluster.CreatePool(cluster_pb2.CreatePoolRequest(pool="nowhere"))   # idempotent
    assert (await client.submit(_ok_spec(pool="nowhere"))).created


async def test_an_idempotency_key_reused_with_another_spec_is_already_exists(api):
    _, client = api
    first = await client.submit(_ok_spec(), key="pay-1")
    again = await client.submit(_ok_spec(), key="pay-1")
    assert first.created and not again.created and again.job.job_id == first.job.job_id
    code, details = await _status(client.submit(_ok_spec(name="other"), key="pay-1"))
    assert code == grpc.StatusCode.ALREADY_EXISTS
    assert details.startswith(f"idempotency_key: already used for job {first.job.job_id}"), details
    code, details = await _status(client.submit_many([(_ok_spec(), "pay-2"), (_ok_spec(workers=2), "pay-1")]))
    assert code == grpc.StatusCode.ALREADY_EXISTS and details.startswith("jobs[1].idempotency_key:"), details


async def test_a_forged_job_submitted_on_the_topic_creates_no_job(api, kafka_bootstrap, topics):
    _, client = api
    forged = [
        ("forged-negative", JobSpec(name="f", team="someone", resources=WorkerResources(gpus=-8))),
        ("forged-pool", JobSpec(name="f", team="someone", pool="default-x", resources=WorkerResources(gpus=1))),
        ("forged-huge", JobSpec(name="f", team="someone", org="o" * 100_000, resources=WorkerResources(gpus=1))),
    ]
    # Written with a login that may write the log (ACLs keep strangers out altogether):
    # the fold itself must keep impossible jobs out.
    producer = AIOKafkaProducer(**client_args(kafka_bootstrap), max_request_size=2_000_000)
    await producer.start()
    for job_id, job_spec in forged:
        event = ev.JobSubmitted(event_id=job_id, time=1.0, producer="forger", job_id=job_id, spec=job_spec)
        await producer.send_and_wait(topics.events, codec.encode(event, "default"), key=b"default",
                                     partition=partition_for("default", 4))
    await producer.stop()
    await client.submit(_ok_spec())   # after the forged records in the same partition: they are folded
    for job_id, _ in forged:
        code, _ = await _status(client.get(job_id))
        assert code == grpc.StatusCode.NOT_FOUND, job_id


async def test_a_team_over_its_submission_rate_gets_resource_exhausted(kafka_bootstrap, topics, tmp_path):
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path)
    admission = await cluster.admission("admission", 0, "--submit-rate", "0.01", "--submit-burst", "3",
                                        "--max-pending-per-team", "0")
    client = Client(f"127.0.0.1:{admission.port}")
    try:
        await client.cluster.CreatePool(cluster_pb2.CreatePoolRequest(pool="default"))
        for i in range(3):
            assert (await client.submit(_ok_spec(name=f"j{i}"))).created
        code, details = await _status(client.submit(_ok_spec(name="j3")))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "--submit-rate" in details, details
        assert details.startswith("spec.team: team 'team-a' is over the submission rate limit"), details
        code, _ = await _status(client.submit_many([(_ok_spec(name="b1", team="team-b"), "")] * 4))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED   # a batch larger than what is left
        assert (await client.submit(_ok_spec(name="b", team="team-b"))).created   # another team's own bucket
        assert len(await client.list_all(team="team-a")) == 3
    finally:
        await client.close()
        await cluster.stop_all()


async def test_a_team_at_its_pending_cap_gets_resource_exhausted_until_one_leaves(kafka_bootstrap, topics, tmp_path):
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path)
    admission = await cluster.admission("admission", 0, "--submit-rate", "0", "--max-pending-per-team", "2")
    client = Client(f"127.0.0.1:{admission.port}")
    try:
        await client.cluster.CreatePool(cluster_pb2.CreatePoolRequest(pool="default"))   # no nodes: jobs stay pending
        first = (await client.submit(_ok_spec(name="p0"))).job
        await client.submit(_ok_spec(name="p1"))
        code, details = await _status(client.submit(_ok_spec(name="p2")))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, details
        assert details.startswith("spec.team: team 'team-a' has 2 pending jobs; the limit (--max-pending-per-team) is 2")
        assert (await client.submit(_ok_spec(name="other", team="team-b"))).created
        await client.jobs.CancelJob(admission_pb2.CancelJobRequest(job_id=first.job_id))
        assert (await client.submit(_ok_spec(name="p2"))).created
    finally:
        await client.close()
        await cluster.stop_all()
