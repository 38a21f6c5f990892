"""A malformed record on the pool log, with every service running: one dead letter with
the reason (the placer owning the partition writes it, also across its restart), one
warning from each service that folds the log and skipped it (node-agents read only their
work views: none from them), and the cluster goes on scheduling. A malformed record on a
node's work view: its agent warns, dead-letters it and goes on."""
from __future__ import annotations

import asyncio

from aiokafka import AIOKafkaProducer

from gpusched.adapters.broker.kafka_security import client_args
from gpusched.adapters.log.publisher import partition_for
from gpusched.adapters.nodes.work_view import work_topic
from gpusched.client import Client, spec
from gpusched.local_cluster import LocalCluster
from gpusched.v1 import events_pb2
from tests.integration.logcheck import read_log
from tests.integration.cluster_calls import SUCCEEDED
from tests.polling import eventually_async

PARTITIONS = 4


async def _run_a_job(client: Client, name: str) -> None:
    job = (await client.submit(spec(name, "team-a", gpus=1, duration=0.1))).job
    (done,) = await client.wait_terminal({job.job_id}, timeout=120)
    assert done.phase == SUCCEEDED


async def _append_garbage(bootstrap, topic: str, partition: int) -> int:
    producer = AIOKafkaProducer(**client_args(bootstrap))
    await producer.start()
    try:
        meta = await producer.send_and_wait(topic, b"\xff\x00 not an envelope", key=b"default", partition=partition)
    finally:
        await producer.stop()
    return meta.offset


def _warnings(service, where: str) -> list[str]:
    return [line for line in service.log_path.read_text().splitlines()
            if "skipped a record it cannot apply" in line and where in line]


async def _letters(bootstrap, topics) -> list[events_pb2.DeadLetter]:
    log = await read_log(bootstrap, topics, topics.dead_letters)
    return [events_pb2.DeadLetter.FromString(value) for records in log.values() for _, value in records]


async def test_a_bad_pool_log_record_is_dead_lettered_once_and_logged_by_each_service(kafka_bootstrap, topics,
                                                                                       tmp_path):
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path, partitions=PARTITIONS)
    try:
        admission = await cluster.admission()
        placer = await cluster.placer("placer", "--no-snapshots")
        await cluster.preemptor()
        await asyncio.gather(cluster.agent("node-0", "4xA100-80GB"), cluster.agent("node-1", "4xA100-80GB"))
        client = Client(f"127.0.0.1:{admission.port}")
        await _run_a_job(client, "before")

        partition = partition_for("default", PARTITIONS)
        offset = await _append_garbage(kafka_bootstrap, topics.events, partition)
        where = f"topic {topics.events} partition {partition} offset {offset}"
        await _run_a_job(client, "after")   # the cluster keeps scheduling

        agents = [service for service in cluster.services if service.name.startswith("agent-")]
        for service in [service for service in cluster.services if service not in agents]:
            await eventually_async(lambda: _warnings(service, where), f"{service.name}'s warning", 60, poll=0.2)
            assert len(_warnings(service, where)) == 1, (service.name, _warnings(service, where))
            assert "not an EventEnvelope" in _warnings(service, where)[0]
        assert "dead letter written" in _warnings(placer, where)[0]
        assert agents and all(_warnings(agent, where) == [] for agent in agents)   # they read no pool log

        letters = [l for l in await _letters(kafka_bootstrap, topics) if l.source_topic == topics.events]
        assert [(l.partition, l.offset) for l in letters] == [(partition, offset)]
        assert "not an EventEnvelope" in letters[0].reason and letters[0].consumer.startswith("placer")
        assert letters[0].value == b"\xff\x00 not an envelope"

        # A restarted placer replays the record (no snapshots): it finds the letter there.
        await placer.terminate()
        again = await cluster.placer("placer-2", "--no-snapshots")
        await eventually_async(lambda: _warnings(again, where), "the restarted placer's warning", 60, poll=0.2)
        assert "already dead-lettered" in _warnings(again, where)[0]
        await _run_a_job(client, "after-restart")
        assert len([l for l in await _letters(kafka_bootstrap, topics) if l.source_topic == topics.events]) == 1
        assert all(s.alive for s in cluster.services if s is not placer)

        view = work_topic(topics.prefix, "node-0")
        offset = await _append_garbage(kafka_bootstrap, view, 0)
        agent = next(a for a in agents if a.name == "agent-node-0")
        await eventually_async(lambda: f"work-view record at offset {offset}" in agent.log_path.read_text(),
                               "the agent's warning", 60, poll=0.2)
        letters = [l for l in await _letters(kafka_bootstrap, topics) if l.source_topic == view]
        assert [(l.offset, l.value) for l in letters] == [(offset, b"\xff\x00 not an envelope")]
        assert "work-view record does not decode" in letters[0].reason
        await _run_a_job(client, "after-view-garbage")
        assert agent.alive
        await client.close()
    finally:
        await cluster.stop_all()
