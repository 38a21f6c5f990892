"""Mixed versions on one log, with real services: a record written before the schema field
existed (an older writer) is folded as schema 1; a record of a newer schema than the
service reads stops it with one line naming the record and the upgrade, instead of a
state that differs from its upgraded replicas (docs/guide/deploying.md, "Upgrades")."""
from __future__ import annotations

import asyncio

from aiokafka import AIOKafkaProducer

from gpusched.adapters.log import codec
from gpusched.adapters.broker.kafka_security import client_args
from gpusched.adapters.log.publisher import partition_for
from gpusched.client import Client
from gpusched.core import events as ev
from gpusched.local_cluster import LocalCluster
from gpusched.v1 import events_pb2
from gpusched.version import LOG_SCHEMA, VERSION

PARTITIONS = 4


def with_schema(event: ev.Event, pool: str, schema: int | None) -> bytes:
    env = events_pb2.EventEnvelope.FromString(codec.encode(event, pool))
    if schema is None:
        env.ClearField("schema")   # as written before the field existed
    else:
        env.schema = schema
    return env.SerializeToString()


async def append(bootstrap, topic: str, pool: str, value: bytes) -> int:
    producer = AIOKafkaProducer(**client_args(bootstrap))
    await producer.start()
    try:
        meta = await producer.send_and_wait(topic, value, key=pool.encode(), partition=partition_for(pool, PARTITIONS))
    finally:
        await producer.stop()
    return meta.offset


async def test_an_older_record_is_folded_and_a_newer_one_stops_the_service_naming_it(kafka_bootstrap, topics,
                                                                                     tmp_path):
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path, partitions=PARTITIONS)
    try:
        admission = await cluster.admission()
        client = Client(f"127.0.0.1:{admission.port}")
        old = ev.PoolCreated(event_id="older-writer-1", time=1.0, producer="admission-older", pool="legacy")
        await append(kafka_bootstrap, topics.events, "legacy", with_schema(old, "legacy", None))
        assert (await client.summary("legacy")).pool == "legacy"   # read-your-writes: folded

        newer = ev.PoolCreated(event_id="newer-writer-1", time=2.0, producer="admission-newer", pool="legacy")
        offset = await append(kafka_bootstrap, topics.events, "legacy",
                              with_schema(newer, "legacy", LOG_SCHEMA + 1))
        code = await asyncio.wait_for(admission.proc.wait(), 60)
        await client.close()
        assert code == 1
        log = admission.log_path.read_text()
        assert "Traceback" not in log, log[-3000:]
        where = f"{topics.events}[{partition_for('legacy', PARTITIONS)}]@{offset}"
        assert log.splitlines()[-1] == (f"{where}: a record of log schema {LOG_SCHEMA + 1} (written by admission-newer);"
                                        f" this gpusched {VERSION} reads log schemas up to {LOG_SCHEMA}: upgrade it "
                                        '(docs/guide/deploying.md, "Upgrades")')
    finally:
        await cluster.stop_all()
