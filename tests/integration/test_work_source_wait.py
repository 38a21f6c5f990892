"""The node-agent's reader of its work view (``work_source.WorkSource``) on a real broker:
its idle fetch wait only sets how often an idle node fetches, never how late a record
comes. With the wait set to 5 s, records appended to an idle view, at random moments of
the fetch in flight, each arrive in a fraction of it (the broker answers a fetch on the
first byte)."""
from __future__ import annotations

import asyncio
import random
import statistics
import time

from aiokafka import AIOKafkaProducer

from gpusched.adapters.broker.kafka_security import client_args
from gpusched.adapters.nodes.node_access import ensure_node_topics
from gpusched.adapters.nodes.work_view import JOB_KEY, OFFSET_HEADER, work_topic
from gpusched_node_agent import work_source
from gpusched_node_agent.work_source import WorkSource

WAIT_MS = 5000
RECORDS = 5


async def test_a_record_reaches_an_idle_work_source_long_before_its_fetch_wait(kafka_bootstrap, topics,
                                                                               monkeypatch):
    monkeypatch.setattr(work_source, "FETCH_WAIT_MS", WAIT_MS)
    node = "wait-n1"
    await ensure_node_topics(kafka_bootstrap, topics, node)
    arrived: dict[str, float] = {}
    changed = asyncio.Event()

    def on_change(key: str, doc: dict) -> None:
        arrived[key] = time.monotonic()
        changed.set()
    source = WorkSource(kafka_bootstrap, topics, node, "wait-source", None, on_change)
    producer = AIOKafkaProducer(**client_args(kafka_bootstrap), acks="all")
    await source.start()
    await producer.start()
    try:
        await source.caught_up(60)
        delays = []
        for i in range(RECORDS):
            await asyncio.sleep(random.uniform(0.2, 1.5))   # idle: a fetch is held at the broker
            key = f"{JOB_KEY}j{i}"
            changed.clear()
            sent = time.monotonic()
            await producer.send_and_wait(work_topic(topics.prefix, node), None, key=key.encode(),
                                         headers=[(OFFSET_HEADER, str(i).encode())])
            await asyncio.wait_for(changed.wait(), WAIT_MS / 1000 * 2)
            delays.append(arrived[key] - sent)
    finally:
        await producer.stop()
        await source.stop()
    # a fetch that waited out its time would give a median of about half the wait
    assert statistics.median(delays) < WAIT_MS / 1000 / 10, delays
