"""Node-agents report through the relay (docs/reference/kafka-security.md, "What a node-agent can
still forge"): with one node's Kafka login nothing about another node, another job or the
cluster's policy reaches the pool log, no beat keeps another node alive, no usage record
about another node's worker reaches billing, and the relay loses and doubles no report
when it is killed -9 in the middle of them."""
from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.errors import TopicAuthorizationFailedError

from gpusched.adapters.log import codec
from gpusched.adapters.log.publisher import partition_for
from gpusched.adapters.broker.kafka_security import client_args
from gpusched.adapters.nodes.reports import KIND_HEADER, USAGE_KIND, beats_topic, node_principal, report_topic
from gpusched.adapters.nodes.usage_records import WorkerUsage, decode_usage, encode_usage
from gpusched.client import Client, spec
from gpusched.core import events as ev
from gpusched.core.model import EXIT_LOST, NodeStatus
from gpusched.core.reducer import apply
from gpusched.core.state import ClusterState
from gpusched.local_cluster import LocalCluster
from gpusched.v1 import admission_pb2, events_pb2, types_pb2
from tests.integration.logcheck import check_log, dead_letters, read_log
from tests.integration.cluster_calls import until_node
from tests.polling import eventually_async
from tests.unit.core.builders import make_spec

SUCCEEDED, RUNNING = types_pb2.JOB_PHASE_SUCCEEDED, types_pb2.JOB_PHASE_RUNNING


async def _write(conn, topic: str, values: list[bytes], pool: str = "default", headers=None) -> list[int]:
    """Records as an agent's producer writes them (idempotent, acks=all); their offsets."""
    producer = AIOKafkaProducer(**client_args(conn), acks="all", enable_idempotence=True, request_timeout_ms=10_000)
    await producer.start()
    try:
        return [(await producer.send_and_wait(topic, v, key=pool.encode(), headers=headers)).offset for v in values]
    finally:
        await producer.stop()


def _forge(cls, **fields) -> ev.Event:
    return cls(event_id=f"forged-{uuid.uuid4().hex}", time=time.time(), producer="node-agent-x", **fields)


async def test_one_nodes_login_cannot_forge_events_about_others(kafka_bootstrap, topics, tmp_path):
    if not kafka_bootstrap.secured:
        pytest.skip("the broker's ACLs are what this checks: the test broker is plaintext")
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path)
    try:
        admission = await cluster.admission()
        await cluster.placer()
        await asyncio.gather(cluster.agent("n1", "2xH100-80GB"), cluster.agent("n2", "2xH100-80GB"))
        client = Client(f"127.0.0.1:{admission.port}")
        victim = (await client.submit(spec("victim", "team-a", gpus=2, duration=300))).job.job_id
        job = await _until_running(client, victim)
        on = job.workers[0].node
        thief = "n1" if on == "n2" else "n2"
        login = kafka_bootstrap.as_user(node_principal(thief), cluster.credentials[node_principal(thief)])

        # The broker refuses the pool log and another node's report topic outright.
        with pytest.raises(TopicAuthorizationFailedError):
            await _write(login, topics.events, [b"forged"])
        with pytest.raises(TopicAuthorizationFailedError):
            await _write(login, report_topic(topics.prefix, on), [b"forged"])

        # Through its own report topic, the relay refuses each, naming what is wrong.
        forged = {
            "about node": _forge(ev.WorkerFinished, job_id=victim, attempt=job.attempt, worker=0, node=on,
                                 exit_code=EXIT_LOST),
            "is not placed on node": _forge(ev.WorkerFinished, job_id=victim, attempt=job.attempt, worker=0,
                                            node=thief, exit_code=0),
            "WorkerStarted about node": _forge(ev.WorkerStarted, job_id=victim, attempt=job.attempt, worker=0, node=on),
            "JobPlaced is not an event a node-agent reports": _forge(ev.JobPlaced, job_id=victim,
                                                                     attempt=job.attempt, workers=()),
            "JobSubmitted is not an event a node-agent reports": _forge(ev.JobSubmitted, job_id="forged-job",
                                                                        spec=make_spec()),
            # an agent cordons its own node only (a worker that outlives SIGKILL), never uncordons
            f"NodeCordoned of node '{on}' reported by node '{thief}'": _forge(ev.NodeCordoned, node=on),
            "NodeUncordoned is not an event a node-agent reports": _forge(ev.NodeUncordoned, node=thief),
        }
        own = report_topic(topics.prefix, thief)
        offsets = await _write(login, own, [codec.encode(e, "default") for e in forged.values()])
        letters = await dead_letters(kafka_bootstrap, topics, own, len(forged))
        for offset, (why, event) in zip(offsets, forged.items()):
            assert why in letters.get(offset, ""), (type(event).__name__, letters)

        # The cluster goes on: a legit job runs to its end, the victim still runs.
        legit = (await client.submit(spec("legit", "team-a", gpus=1, duration=0.2))).job.job_id
        (done,) = await client.wait_terminal({legit})
        assert done.phase == SUCCEEDED
        assert (await client.get(victim)).phase == RUNNING
        assert all(s.alive for s in cluster.services)
        await client.close()
    finally:
        await cluster.stop_all()

    pool_log = await read_log(kafka_bootstrap, topics)
    ids = {codec.decode(v)[0].event_id for records in pool_log.values() for _, v in records}
    assert not {e.event_id for e in forged.values()} & ids
    assert check_log(pool_log).violations == []


async def _until_running(client: Client, job_id: str):
    stream = client.jobs.WatchJobs(admission_pb2.WatchJobsRequest())
    try:
        async for update in stream:
            if update.job.job_id == job_id and update.job.phase == RUNNING:
                return update.job
    finally:
        stream.cancel()


async def test_one_nodes_login_cannot_keep_another_alive_or_report_its_usage(kafka_bootstrap, topics, tmp_path):
    if not kafka_bootstrap.secured:
        pytest.skip("the broker's ACLs are what this checks: the test broker is plaintext")
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path)
    try:
        admission = await cluster.admission()
        await cluster.placer()
        await cluster.preemptor("preemptor", "--heartbeat-timeout", "3")
        agents = dict(zip(("n1", "n2"), await asyncio.gather(
            *(cluster.agent(n, "2xH100-80GB", "--heartbeat-interval", "0.5") for n in ("n1", "n2")))))
        client = Client(f"127.0.0.1:{admission.port}")
        victim = (await client.submit(spec("victim", "team-a", gpus=2, duration=300))).job.job_id
        job = await _until_running(client, victim)
        on = job.workers[0].node
        thief = "n1" if on == "n2" else "n2"
        login = kafka_bootstrap.as_user(node_principal(thief), cluster.credentials[node_principal(thief)])

        # The broker refuses the shared topics outright, and the other node's beats topic.
        for topic in (topics.heartbeats, topics.usage, beats_topic(topics.prefix, on)):
            with pytest.raises(TopicAuthorizationFailedError):
                await _write(login, topic, [b"forged"])

        # A usage record about the victim's worker, then one about the thief's own node:
        # the relay refuses the first and forwards the second, in order.
        usage = [_usage(node, victim, job.attempt) for node in (on, thief)]
        own = report_topic(topics.prefix, thief)
        offsets = await _write(login, own, [encode_usage(u) for u in usage], headers=[(KIND_HEADER, USAGE_KIND)])
        letters = await dead_letters(kafka_bootstrap, topics, own, 1)
        assert f"usage record of node {on!r} reported by node {thief!r}" in letters.get(offsets[0], ""), letters
        forwarded = await _until_usage(kafka_bootstrap, topics, usage[1].record_id)
        assert usage[1].record_id in forwarded and usage[0].record_id not in forwarded

        # The victim's node dies while the thief's login beats in its name on its own topic.
        async def beat_as(node: str) -> None:
            producer = AIOKafkaProducer(**client_args(login), acks="all", enable_idempotence=True)
            await producer.start()
            try:
                while True:
                    beat = events_pb2.Heartbeat(node=node, pool="default", time=time.time())
                    await producer.send_and_wait(beats_topic(topics.prefix, thief), beat.SerializeToString())
                    await asyncio.sleep(0.2)   # the forger's beat period
            finally:
                await producer.stop()
        forger = asyncio.create_task(beat_as(on))
        try:
            await agents[on].kill9()
            # Within the timeout (3 s) plus the preemptor's tick and a slow machine's slack.
            await until_node(kafka_bootstrap, topics, on, NodeStatus.LOST, timeout=30.0)
            assert not forger.done()   # it kept beating all along
        finally:
            forger.cancel()
            await asyncio.gather(forger, return_exceptions=True)
        await client.close()
    finally:
        await cluster.stop_all()
    assert check_log(await read_log(kafka_bootstrap, topics)).violations == []


def _usage(node: str, job_id: str, attempt: int) -> WorkerUsage:
    return WorkerUsage(record_id=f"forged-{uuid.uuid4().hex}", node=node, pool="default", job_id=job_id,
                       attempt=attempt, worker=0, time=time.time(), window_s=1.0)


async def _until_usage(conn, topics, record_id: str, timeout: float = 60.0) -> set[str]:
    """The record ids on the usage topic, once ``record_id`` is among them."""
    async def forwarded():   # polls the topic: the relay forwards asynchronously
        ids = {decode_usage(v).record_id for vs in (await read_log(conn, topics, topics.usage)).values()
               for _, v in vs}
        return record_id in ids and ids
    return await eventually_async(forwarded, f"usage record {record_id} forwarded", timeout, poll=0.2)


async def test_a_relay_killed_mid_reports_loses_and_doubles_none(kafka_bootstrap, topics, tmp_path):
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path)
    try:
        admission = await cluster.admission("admission", 0, "--no-relay")
        relay = await cluster.relay()
        await cluster.placer()
        await asyncio.gather(*(cluster.agent(f"n{i}", "4xH100-80GB") for i in range(2)))
        client = Client(f"127.0.0.1:{admission.port}")
        specs = [spec(f"j{i}", "team-a", gpus=1, duration=0.3 + (i % 5) * 0.1) for i in range(80)]
        job_ids = {r.job.job_id for r in await asyncio.gather(*(client.submit(s) for s in specs))}
        await client.wait_terminal(set(sorted(job_ids)[:1]))   # reports are flowing: kill it amid them
        await relay.kill9()
        await cluster.relay("relay-2")
        jobs = await client.wait_terminal(job_ids, timeout=300)
        assert sorted(j.phase for j in jobs) == [SUCCEEDED] * len(job_ids), [j.reason for j in jobs]
        await client.close()
    finally:
        await cluster.stop_all()

    pool_log = await read_log(kafka_bootstrap, topics)
    assert check_log(pool_log).violations == []
    applied: Counter = Counter()
    for partition, records in pool_log.items():
        state = ClusterState()
        for _, value in records:
            event = codec.decode(value)[0]
            if apply(state, event).accepted and isinstance(event, (ev.WorkerStarted, ev.WorkerFinished)):
                applied[(type(event).__name__, event.job_id, event.attempt, event.worker)] += 1
    # every worker of every job started and finished once, at its first attempt
    expected = {(kind, job_id, 0, 0) for job_id in job_ids for kind in ("WorkerStarted", "WorkerFinished")}
    assert set(applied) == expected and set(applied.values()) == {1}
