"""Appending to the pool log, and to the dead-letter topic.

``EventPublisher`` appends events with ``acks=all`` and idempotence; the partition is
chosen from the pool so one pool's history is one totally ordered partition. Its linger
follows its send rate, every send counted whatever its topic, and a batch carries up to
``MAX_BATCH_BYTES`` (``gpusched.adapters.log.batching``). ``DeadLetters`` writes the records
no consumer could apply, with the reason.

Every record carries Kafka headers for consumers outside gpusched (docs/reference/consuming-the-log.md):
``gpusched.schema`` (the protobuf message of its value, e.g. ``gpusched.v1.EventEnvelope``),
on the pool log and report topics ``gpusched.event-type`` (``JobPlaced``...), and the W3C
trace context of the event (``traceparent``, ``tracestate``), the same as its envelope's.
"""
from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import NamedTuple

from aiokafka import AIOKafkaProducer
from aiokafka.errors import OutOfOrderSequenceNumber
from aiokafka.partitioner import murmur2

from gpusched.adapters.log import codec
from gpusched.adapters.log.batching import LINGER_MS, MAX_BATCH_BYTES, LingerTuner
from gpusched.adapters.log.dead_letters import LetterIndex, WarningLimit, letter_key
from gpusched.adapters.broker.kafka_admin import TopicNames
from gpusched.adapters.broker.kafka_security import Where, client_args
from gpusched.adapters.nodes.reports import KIND_HEADER, USAGE_KIND
from gpusched.adapters.telemetry.tracing import current_context, event_context
from gpusched.core import events as ev
from gpusched.v1 import events_pb2

log = logging.getLogger(__name__)


SCHEMA_HEADER = "gpusched.schema"
EVENT_TYPE_HEADER = "gpusched.event-type"
ENVELOPE_SCHEMA = b"gpusched.v1.EventEnvelope"
# The message in each other topic's records, by the topic's name after the prefix; the
# per-node and per-host topics by the start of it (reports.<node>, hostbeats.<host>).
USAGE_SCHEMA = b"gpusched.v1.WorkerUsage"
RAW_SCHEMAS = {"dead-letters": b"gpusched.v1.DeadLetter", "heartbeats": b"gpusched.v1.Heartbeat",
               "usage": USAGE_SCHEMA, "beats.": b"gpusched.v1.Heartbeat", "reports.": ENVELOPE_SCHEMA,
               "hostbeats.": b"gpusched.v1.HostBeats", "hostreports.": ENVELOPE_SCHEMA}


def event_headers(event: ev.Event, carrier: dict[str, str]) -> list[tuple[str, bytes]]:
    """The headers of an event's record: its schema, its type and its trace context."""
    return [(SCHEMA_HEADER, ENVELOPE_SCHEMA), (EVENT_TYPE_HEADER, type(event).__name__.encode()),
            *((key, value.encode()) for key, value in carrier.items())]


def raw_schema(prefix: str, topic: str) -> bytes | None:
    """The message type of ``topic``'s records (None: not a topic of ``RAW_SCHEMAS``)."""
    name = topic[len(prefix):] if topic.startswith(prefix) else topic
    return RAW_SCHEMAS.get(name) or next(
        (schema for start, schema in RAW_SCHEMAS.items() if start.endswith(".") and name.startswith(start)), None)


@functools.lru_cache(maxsize=4096)
def partition_for(pool: str, partitions: int) -> int:
    """Kafka's default partitioner (murmur2 of the key), computed here so consumers
    can find their pool's partition without producing first. Cached: aiokafka's murmur2
    is pure Python (several microseconds a call), and every event appended and every report relayed
    asks (pools are few)."""
    return (murmur2(pool.encode()) & 0x7FFFFFFF) % partitions


@dataclass(frozen=True, slots=True)
class Position:
    partition: int
    offset: int


class EventPublisher:
    def __init__(self, bootstrap: Where, topics: TopicNames, partitions: int) -> None:
        self.topics = topics
        self.partitions = partitions
        self._bootstrap = bootstrap
        self._linger = LingerTuner()
        self._producer = self._new_producer()
        self._renewal: asyncio.Task | None = None   # a new producer starting (``_after_ack``)
        self._retired: asyncio.Task | None = None   # the old one stopping

    def _new_producer(self) -> AIOKafkaProducer:
        return AIOKafkaProducer(
            **client_args(self._bootstrap), acks="all", enable_idempotence=True,
            linger_ms=self._linger.linger_ms, max_batch_size=MAX_BATCH_BYTES, request_timeout_ms=30_000,
            retry_backoff_ms=100,
        )

    @property
    def linger_ms(self) -> int:
        return self._linger.linger_ms

    async def start(self) -> None:
        await self._producer.start()

    async def stop(self) -> None:
        await asyncio.gather(*(t for t in (self._renewal, self._retired) if t is not None), return_exceptions=True)
        await self._producer.stop()

    def _after_ack(self, producer: AIOKafkaProducer, future: asyncio.Future) -> None:
        # A record the broker refused (not authorized, say) is never sent again by the
        # idempotent producer, yet its sequence number is spent: the broker then refuses
        # every later record of that partition as out of order, so each sender's retries
        # would fail forever. A new producer (a new producer id, numbered from 0) ends it.
        if future.cancelled() or not isinstance(future.exception(), OutOfOrderSequenceNumber):
            return
        if producer is self._producer and (self._renewal is None or self._renewal.done()):
            self._renewal = asyncio.ensure_future(self._renew(producer))

    async def _renew(self, old: AIOKafkaProducer) -> None:
        fresh = self._new_producer()
        try:
            await fresh.start()
        except Exception as exc:   # the next record refused out of order tries again
            log.warning("no new producer after records refused out of order: %r", exc)
            return
        self._producer = fresh
        log.warning("records refused out of order after a refused one: sending through a new producer")
        # what the old one still holds fails there, and its senders send it again
        self._retired = asyncio.ensure_future(old.stop())

    async def _send(self, topic: str, value: bytes, **kwargs) -> asyncio.Future:
        """Every record goes out here: through the current producer (once a renewal in
        progress is done), its acknowledgement watched for the gap a refusal leaves
        (``_after_ack``) - on the pool log as on any other topic."""
        if self._renewal is not None and not self._renewal.done():
            await asyncio.gather(self._renewal, return_exceptions=True)
        producer = self._producer
        self._linger.count(producer)
        future = await producer.send(topic, value, **kwargs)
        future.add_done_callback(functools.partial(self._after_ack, producer))
        return future

    async def send(self, event: ev.Event, pool: str, carrier: dict[str, str] | None = None) -> asyncio.Future:
        """Queue the event; the returned future resolves when the broker acknowledged it.
        ``carrier``: the trace context to write (a relayed report keeps its own), else
        this process's (``tracing.event_context``)."""
        carrier = carrier or event_context(event)
        return await self._send(self.topics.events, codec.encode(event, pool, carrier), key=pool.encode(),
                                partition=partition_for(pool, self.partitions), headers=event_headers(event, carrier))

    async def send_event_to(self, topic: str, event: ev.Event, pool: str,
                            extra_headers: list[tuple[str, bytes]] | None = None) -> asyncio.Future:
        """``send`` to another topic of events (a node's report topic), keyed by the pool."""
        carrier = event_context(event)
        return await self._send(topic, codec.encode(event, pool, carrier), key=pool.encode(),
                                headers=event_headers(event, carrier) + list(extra_headers or ()))

    async def publish(self, event: ev.Event, pool: str) -> Position:
        meta = await (await self.send(event, pool))
        return Position(meta.partition, meta.offset)

    async def publish_to(self, event: ev.Event, partition: int) -> Position:
        """An event about a partition's log itself (its ``JobRetentionSet``), not a pool."""
        carrier = current_context()
        future = await self._send(self.topics.events, codec.encode(event, "", carrier),
                                  partition=partition, headers=event_headers(event, carrier))
        meta = await future
        return Position(meta.partition, meta.offset)

    async def publish_all(self, items: list[tuple[ev.Event, str]]) -> list[Position]:
        futures = [await self.send(e, pool) for e, pool in items]
        return [Position(m.partition, m.offset) for m in await asyncio.gather(*futures)]

    async def send_raw(self, topic: str, value: bytes, key: bytes | None = None,
                       partition: int | None = None, headers: list[tuple[str, bytes]] | None = None) -> None:
        await (await self.send_raw_later(topic, value, key, partition, headers))

    async def send_raw_later(self, topic: str, value: bytes, key: bytes | None = None,
                             partition: int | None = None,
                             headers: list[tuple[str, bytes]] | None = None) -> asyncio.Future:
        """Queue a record; the returned future resolves when the broker acknowledged it. A
        ``gpusched.schema`` header is added from the topic where the caller gave none."""
        headers = list(headers or ())   # (a node host's beats, the work views: a burst batches too)
        # a usage record on a node's report topic is marked as such (its other records are events)
        schema = USAGE_SCHEMA if (KIND_HEADER, USAGE_KIND) in headers else raw_schema(self.topics.prefix, topic)
        if schema is not None and all(name != SCHEMA_HEADER for name, _ in headers):
            headers.append((SCHEMA_HEADER, schema))
        return await self._send(topic, value, key=key, partition=partition, headers=headers or None)


class DeadLetters:
    """Records a consumer cannot apply. Every consumer that skips one logs a warning (topic,
    partition, offset, reason; at most ``WARNINGS_PER_MINUTE`` lines a minute), and one
    letter per record goes to the dead-letter topic. The pool log is folded by every
    service, so only its designated writer, the placer that owns the partition (the one
    given an ``index``), writes its letters, after checking the topic does not hold it
    yet; other topics have one consumer, which writes (docs/design/architecture.md)."""

    def __init__(self, publisher: EventPublisher | None, consumer: str, index: LetterIndex | None = None) -> None:
        # publisher None: a read-only consumer (billing, reports), whose principal may not
        # write; it only logs the record.
        self._publisher = publisher
        self._consumer = consumer
        self._index = index
        self._warnings = WarningLimit(log, f"{consumer}: records skipped")
        self.skipped: deque[tuple[str, int, int, str]] = deque(maxlen=100)   # the latest, for tests

    async def put(self, record, reason: str) -> None:
        self.skipped.append((record.topic, record.partition, record.offset, reason))
        where = f"topic {record.topic} partition {record.partition} offset {record.offset}"
        if self._publisher is None:
            self._warn(where, reason, "read-only here: not dead-lettered")
            return
        if record.topic == self._publisher.topics.events and self._index is None:
            self._warn(where, reason, "the placer dead-letters pool-log records")
            return
        key = letter_key(record.topic, record.partition, record.offset)
        if self._index is not None and await self._index.holds(key):
            self._warn(where, reason, "already dead-lettered")
            return
        letter = events_pb2.DeadLetter(
            source_topic=record.topic, partition=record.partition, offset=record.offset,
            consumer=self._consumer, reason=reason, key=record.key or b"",
            value=record.value or b"", time=time.time(),
        )
        try:
            await self._publisher.send_raw(self._publisher.topics.dead_letters, letter.SerializeToString(), key=key)
        except Exception:  # the DLQ being down must not stop the consumer
            log.exception("could not write dead letter for %s", where)
            return
        if self._index is not None:
            self._index.add(key)
        self._warn(where, reason, f"dead letter written to {self._publisher.topics.dead_letters}")

    async def stop(self) -> None:
        if self._index is not None:
            await self._index.stop()

    def _warn(self, where: str, reason: str, outcome: str) -> None:
        self._warnings.warn("%s: skipped a record it cannot apply: %s: %s (%s)", self._consumer, where, reason,
                            outcome)


class DeadRecord(NamedTuple):
    """What ``DeadLetters.put`` reads of a record, for records folded from a catch-up frame."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
