"""The real broker works the way the scheduler relies on: idempotent acks=all
produce, per-key order, a compacted snapshots topic, and durable records across
a broker restart."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from gpusched.adapters.broker.kafka_admin import TopicNames
from gpusched.adapters.broker.kafka_security import client_args

pytestmark = pytest.mark.broker


async def produce(bootstrap: str, topic: str, records: list[tuple[str, bytes]]) -> None:
    """Send (key, value) records with acks=all + idempotence; wait for every ack."""
    producer = AIOKafkaProducer(**client_args(bootstrap), acks="all",
                                enable_idempotence=True, request_timeout_ms=30000)
    await producer.start()
    try:
        futures = [await producer.send(topic, value=v, key=k.encode()) for k, v in records]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def read_all(bootstrap: str, topic: str, expected: int, timeout_s: float = 30.0):
    """Read every partition of ``topic`` from offset 0 (manual assignment, no
    group) until ``expected`` records arrived; returns them in partition order."""
    # (consumer.partitions_for_topic() only knows topics already in the client's
    # metadata, so ask the admin client.)
    admin = AIOKafkaAdminClient(**client_args(bootstrap))
    await admin.start()
    try:
        [described] = await admin.describe_topics([topic])
    finally:
        await admin.close()
    tps = [TopicPartition(topic, p["partition"]) for p in described["partitions"]]
    assert tps, f"topic {topic} has no partitions: {described}"

    consumer = AIOKafkaConsumer(**client_args(bootstrap), group_id=None,
                                enable_auto_commit=False, auto_offset_reset="earliest")
    await consumer.start()
    try:
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, 0)
        out = []
        deadline = time.monotonic() + timeout_s
        while len(out) < expected and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=500)
            for tp in sorted(batch, key=lambda t: t.partition):
                out.extend(batch[tp])
        return out
    finally:
        await consumer.stop()


async def test_produce_then_consume_in_key_order(kafka_bootstrap: str, topics: TopicNames):
    pools = ["pool-a", "pool-b", "pool-c"]
    sent = [(pools[i % 3], f"{pools[i % 3]}:{i}".encode()) for i in range(90)]
    await produce(kafka_bootstrap, topics.events, sent)

    got = await read_all(kafka_bootstrap, topics.events, len(sent))
    assert len(got) == len(sent)
    for pool in pools:
        mine = [r for r in got if r.key == pool.encode()]
        # Same key -> same partition, offsets 0.. in send order.
        assert len({r.partition for r in mine}) == 1
        assert [r.value for r in mine] == [v for k, v in sent if k == pool]
        offsets = [r.offset for r in mine]
        assert offsets == sorted(offsets)


async def test_topic_layout(kafka_bootstrap: str, topics: TopicNames):
    admin = AIOKafkaAdminClient(**client_args(kafka_bootstrap))
    await admin.start()
    try:
        described = {t["topic"]: t for t in await admin.describe_topics(list(topics.all()))}
        partitions = {name: len(t["partitions"]) for name, t in described.items()}
        assert partitions == {topics.events: 4, topics.heartbeats: 4,
                              topics.dead_letters: 1, topics.snapshots: 4, topics.usage: 4}

        [resp] = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, topics.snapshots),
             ConfigResource(ConfigResourceType.TOPIC, topics.heartbeats)])
        configs = {
            res["resource_name"]: {e["config_names"]: e["config_value"]
                                   for e in res["config_entries"]}
            for res in resp.to_object()["resources"]
        }
        assert configs[topics.snapshots]["cleanup.policy"] == "compact"
        assert configs[topics.heartbeats]["retention.ms"] == str(3600 * 1000)
    finally:
        await admin.close()


@pytest.mark.parametrize("hard", [False, True], ids=["sigterm", "sigkill"])
async def test_acknowledged_records_survive_broker_restart(
    kafka_bootstrap: str, topics: TopicNames, kafka_control, hard: bool
):
    before = [(f"pool-{i % 2}", f"before:{i}".encode()) for i in range(40)]
    await produce(kafka_bootstrap, topics.events, before)

    t0 = time.monotonic()
    await kafka_control.restart_async(hard=hard)
    print(f"broker restart ({'SIGKILL' if hard else 'SIGTERM'}) took {time.monotonic() - t0:.1f}s")

    # Everything acknowledged before the restart is still there, in order...
    got = await read_all(kafka_bootstrap, topics.events, len(before))
    assert sorted(r.value for r in got) == sorted(v for _, v in before)
    # ...and the restarted broker takes new writes after the old ones.
    after = [("pool-0", b"after:0")]
    await produce(kafka_bootstrap, topics.events, after)
    got = await read_all(kafka_bootstrap, topics.events, len(before) + 1)
    pool0 = [r.value for r in got if r.key == b"pool-0"]
    assert pool0 == [v for k, v in before if k == "pool-0"] + [b"after:0"]
