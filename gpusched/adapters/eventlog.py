"""The pool log on Kafka: publish events, follow partitions, fold them with the reducer.

- ``EventPublisher`` appends events with ``acks=all`` and idempotence; the partition is
  chosen from the pool so one pool's history is one totally ordered partition.
- ``LogFollower`` reads partitions from the beginning (or a snapshot's offset), decodes
  each record, applies it with the shared reducer to that partition's ``ClusterState``
  and tells the service through a callback. A record it cannot decode goes to the
  dead-letter topic with the reason, and the follower moves on.
- With a ``group_id`` the follower is a consumer-group member: partitions (pools) come
  and go with rebalances, and each newly assigned one is rebuilt from the log.
"""
from __future__ import annotations

import asyncio
import heapq
import logging
import time
from dataclasses import dataclass
from typing import Awaitable, Callable

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.partitioner import murmur2

from gpusched.adapters import codec
from gpusched.adapters.kafka_admin import TopicNames
from gpusched.adapters.tracing import current_context
from gpusched.core import events as ev
from gpusched.core.reducer import Outcome, apply
from gpusched.core.state import ClusterState
from gpusched.v1 import events_pb2

log = logging.getLogger(__name__)


def partition_for(pool: str, partitions: int) -> int:
    """Kafka's default partitioner (murmur2 of the key), computed here so consumers
    can find their pool's partition without producing first."""
    return (murmur2(pool.encode()) & 0x7FFFFFFF) % partitions


@dataclass(frozen=True, slots=True)
class Position:
    partition: int
    offset: int


class EventPublisher:
    def __init__(self, bootstrap: str, topics: TopicNames, partitions: int) -> None:
        self.topics = topics
        self.partitions = partitions
        self._producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap, acks="all", enable_idempotence=True,
            linger_ms=1, request_timeout_ms=30_000, retry_backoff_ms=100,
        )

    async def start(self) -> None:
        await self._producer.start()

    async def stop(self) -> None:
        await self._producer.stop()

    async def send(self, event: ev.Event, pool: str) -> asyncio.Future:
        """Queue the event; the returned future resolves when the broker acknowledged it."""
        value = codec.encode(event, pool, current_context())
        return await self._producer.send(
            self.topics.events, value, key=pool.encode(),
            partition=partition_for(pool, self.partitions),
        )

    async def publish(self, event: ev.Event, pool: str) -> Position:
        meta = await (await self.send(event, pool))
        return Position(meta.partition, meta.offset)

    async def publish_all(self, items: list[tuple[ev.Event, str]]) -> list[Position]:
        futures = [await self.send(e, pool) for e, pool in items]
        return [Position(m.partition, m.offset) for m in await asyncio.gather(*futures)]

    async def send_raw(self, topic: str, value: bytes, key: bytes | None = None,
                       partition: int | None = None) -> None:
        await self._producer.send_and_wait(topic, value, key=key, partition=partition)


class DeadLetters:
    """Writes records no consumer could apply, with the reason, to the dead-letter topic."""

    def __init__(self, publisher: EventPublisher, consumer: str) -> None:
        self._publisher = publisher
        self._consumer = consumer

    async def put(self, record, reason: str) -> None:
        letter = events_pb2.DeadLetter(
            source_topic=record.topic, partition=record.partition, offset=record.offset,
            consumer=self._consumer, reason=reason, key=record.key or b"",
            value=record.value or b"", time=time.time(),
        )
        try:
            await self._publisher.send_raw(self._publisher.topics.dead_letters, letter.SerializeToString(),
                                           key=f"{record.partition}:{record.offset}".encode())
        except Exception:  # the DLQ being down must not stop the consumer
            log.exception("could not write dead letter for %s:%s", record.partition, record.offset)


# (partition, offset, event, outcome, state)
OnEvent = Callable[[int, int, ev.Event, Outcome, ClusterState], None]
OnPartitions = Callable[[set[int]], Awaitable[None] | None]


class LogFollower:
    def __init__(self, bootstrap: str, topics: TopicNames, name: str, dead_letters: DeadLetters,
                 on_event: OnEvent | None = None, partitions: list[int] | None = None,
                 group_id: str | None = None, on_assigned: OnPartitions | None = None,
                 on_revoked: OnPartitions | None = None) -> None:
        self.topics = topics
        self.name = name
        self.states: dict[int, ClusterState] = {}
        self._bootstrap = bootstrap
        self._dead_letters = dead_letters
        self._on_event = on_event
        self._partitions = partitions
        self._group_id = group_id
        self._on_assigned = on_assigned
        self._on_revoked = on_revoked
        self._waiters: dict[int, list[tuple[int, int, asyncio.Future]]] = {}
        self._counter = 0
        self._consumer: AIOKafkaConsumer | None = None
        self._task: asyncio.Task | None = None
        self.changed = asyncio.Event()   # set after every batch that applied something

    async def start(self) -> None:
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=self._bootstrap, group_id=self._group_id,
            enable_auto_commit=False, auto_offset_reset="earliest",
            fetch_max_wait_ms=200, max_partition_fetch_bytes=4 * 1024 * 1024,
            isolation_level="read_uncommitted", client_id=self.name,
            session_timeout_ms=10_000, heartbeat_interval_ms=1_000,
            max_poll_interval_ms=300_000, rebalance_timeout_ms=10_000,
        )
        await self._consumer.start()
        if self._group_id:
            self._consumer.subscribe([self.topics.events], listener=_Rebalance(self))
        else:
            parts = self._partitions
            if parts is None:
                parts = sorted(self._consumer.partitions_for_topic(self.topics.events) or [])
                if not parts:
                    parts = sorted(await self._fetch_partitions())
            tps = [TopicPartition(self.topics.events, p) for p in parts]
            self._consumer.assign(tps)
            for p in parts:
                self._reset(p)
            await self._consumer.seek_to_beginning(*tps)
        self._task = asyncio.create_task(self._run(), name=f"follow-{self.name}")

    async def _fetch_partitions(self) -> set[int]:
        await self._consumer._client.force_metadata_update()
        return self._consumer._client.cluster.partitions_for_topic(self.topics.events) or set()

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
        if self._consumer:
            await self._consumer.stop()

    def _reset(self, partition: int) -> None:
        self.states[partition] = ClusterState()

    async def _run(self) -> None:
        consumer = self._consumer
        while True:
            try:
                batches = await consumer.getmany(timeout_ms=500, max_records=5000)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("%s: fetch failed; retrying", self.name)
                await asyncio.sleep(0.5)
                continue
            applied = False
            for tp, records in batches.items():
                state = self.states.get(tp.partition)
                if state is None:
                    continue   # revoked while the fetch was in flight
                for record in records:
                    if record.offset <= state.offset:
                        continue
                    await self._fold(state, record)
                    applied = True
                self._wake(tp.partition, state.offset)
            if applied:
                self.changed.set()

    async def _fold(self, state: ClusterState, record) -> None:
        try:
            event, _env = codec.decode(record.value)
        except codec.DecodeError as exc:
            state.offset = record.offset
            await self._dead_letters.put(record, str(exc))
            return
        try:
            outcome = apply(state, event)
        except Exception as exc:  # a reducer bug must not stop the service
            log.exception("reducer failed on %s:%s", record.partition, record.offset)
            state.offset = record.offset
            await self._dead_letters.put(record, f"reducer error: {exc!r}")
            return
        state.offset = record.offset
        if self._on_event is not None:
            try:
                self._on_event(record.partition, record.offset, event, outcome, state)
            except Exception:
                log.exception("%s: handler failed on %s:%s", self.name, record.partition, record.offset)

    # --- read-your-writes -------------------------------------------------------------
    async def wait_applied(self, pos, timeout: float = 30.0) -> ClusterState:
        """Wait until the record at ``pos`` has been folded into the state."""
        state = self.states.get(pos.partition)
        if state is not None and state.offset >= pos.offset:
            return state
        fut = asyncio.get_running_loop().create_future()
        self._counter += 1
        heapq.heappush(self._waiters.setdefault(pos.partition, []), (pos.offset, self._counter, fut))
        await asyncio.wait_for(fut, timeout)
        return self.states[pos.partition]

    def _wake(self, partition: int, offset: int) -> None:
        heap = self._waiters.get(partition)
        while heap and heap[0][0] <= offset:
            _, _, fut = heapq.heappop(heap)
            if not fut.done():
                fut.set_result(None)

    async def end_positions(self) -> dict[int, int]:
        """Offset of the last record now in each followed partition (-1 when empty)."""
        tps = [TopicPartition(self.topics.events, p) for p in self.states]
        ends = await self._consumer.end_offsets(tps)
        return {tp.partition: off - 1 for tp, off in ends.items()}

    async def caught_up(self, timeout: float = 120.0) -> None:
        """Wait until everything in the log when called has been applied."""
        for partition, last in (await self.end_positions()).items():
            if last >= 0:
                await self.wait_applied(Position(partition, last), timeout)


class _Rebalance(ConsumerRebalanceListener):
    def __init__(self, follower: LogFollower) -> None:
        self.f = follower

    async def on_partitions_revoked(self, revoked) -> None:
        parts = {tp.partition for tp in revoked}
        for p in parts:
            self.f.states.pop(p, None)
        if parts and self.f._on_revoked:
            await _maybe_await(self.f._on_revoked(parts))

    async def on_partitions_assigned(self, assigned) -> None:
        parts = {tp.partition for tp in assigned}
        for p in parts:
            self.f._reset(p)
        if assigned:
            await self.f._consumer.seek_to_beginning(*assigned)
        if parts and self.f._on_assigned:
            await _maybe_await(self.f._on_assigned(parts))


async def _maybe_await(result) -> None:
    if asyncio.iscoroutine(result):
        await result
