"""What every service process does around its own logic: Kafka plumbing, a gRPC server
with health, and a clean stop on SIGTERM/SIGINT."""
from __future__ import annotations

import asyncio
import signal
import uuid

from gpusched.adapters.publisher import DeadLetters, EventPublisher
from gpusched.adapters.gc_pacing import pace_gc
from gpusched.adapters.kafka_admin import TopicNames, ensure_topics, wait_for_broker
from gpusched.adapters.kafka_security import KafkaConnection, KafkaLoginRefused
from gpusched.config import KafkaSettings


def instance_id(service: str) -> str:
    return f"{service}-{uuid.uuid4().hex[:8]}"


async def connect(settings: KafkaSettings, instance: str) -> tuple[EventPublisher, DeadLetters]:
    pace_gc()   # a service lives long and its state grows: see gc_pacing
    conn, topics = KafkaConnection.from_settings(settings), TopicNames(settings.topic_prefix)
    try:
        await wait_for_broker(conn, 120)
    except KafkaLoginRefused as exc:   # wrong credentials: a one-line reason, no traceback
        raise SystemExit(f"{instance}: {exc}") from None
    try:
        await ensure_topics(conn, topics, settings.partitions,
                            replication_factor=settings.replication_factor,
                            min_insync_replicas=settings.min_insync_replicas)
    except PermissionError as exc:   # topics missing on a secured cluster
        raise SystemExit(f"{instance}: {exc}") from None
    publisher = EventPublisher(conn, topics, settings.partitions)
    await publisher.start()
    return publisher, DeadLetters(publisher, instance)


def stop_event() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop
