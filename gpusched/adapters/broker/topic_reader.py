"""One raw reader of Kafka topics: what every hand-written consumer loop of the project
shares, so each of them keeps only its handling of the records.

The pool log is read by ``LogFollower`` and the audit and billing consumers by faust;
everything else that reads Kafka record by record (heartbeats, the relay's reports, the
dead-letter index, snapshots, work views, usage records, the catch-up reader, the
consumers' gap fold) reads through a ``TopicReader``. It owns:

* the consumer's construction from the project's connection (``kafka_security.client_args``:
  bootstrap and security), with the user's fetch settings passed on as given, and never
  an automatic commit: a reader in a group commits what its user says, when it says;
* which partitions it reads: assigned (``assign``, from the beginning, the end, an
  offset, or where the consumer's reset policy puts it) or by group or pattern
  subscription (``subscribe``);
* seeking, offsets and metadata (a topic's partitions, every topic's name);
* fetching a batch (``fetch``) or a loop of them handed to the user (``run``), with one
  place that decides what a failed fetch does;
* a clean stop, whatever was started.

What a record means, and what to do with one that does not decode (most send it to the
dead-letter topic), stays with the user.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable, Iterable, Literal, Union

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.structs import ConsumerRecord

from gpusched.adapters.broker.kafka_security import Where, client_args

log = logging.getLogger(__name__)

Batches = dict[TopicPartition, list[ConsumerRecord]]
# Where an assignment starts: each partition's first or next offset, one offset for every
# partition, or (None) where the consumer's ``auto_offset_reset`` (or a seek later) puts it.
Start = Union[Literal["beginning", "end"], int, None]
Handle = Callable[[Batches], Awaitable[None]]
# Called with a fetch's error: return (after a back-off) to fetch again, raise to stop.
OnFetchError = Callable[[Exception], Awaitable[None]]


class TopicReader:
    """A consumer of ``where`` (a ``KafkaConnection`` or a bare bootstrap), built by
    ``start`` with ``group_id`` (None: no group, no commits) and ``options``, the aiokafka
    consumer's own settings (``client_id``, ``fetch_max_wait_ms``, ``isolation_level``,
    ``auto_offset_reset``, ...), passed on unchanged."""

    def __init__(self, where: Where, *, group_id: str | None = None, **options) -> None:
        if "enable_auto_commit" in options:
            raise TypeError("a TopicReader never commits on its own: commit() what is handled")
        self.where = where
        self.group_id = group_id
        self.options = options
        self._consumer: AIOKafkaConsumer | None = None

    # --- lifecycle ------------------------------------------------------------------------
    async def start(self) -> "TopicReader":
        if self._consumer is None:
            consumer = AIOKafkaConsumer(**client_args(self.where), group_id=self.group_id,
                                        enable_auto_commit=False, **self.options)
            await consumer.start()
            self._consumer = consumer
        return self

    async def stop(self) -> None:
        """Close the consumer (and leave a group it is in); again is a no-op."""
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            await consumer.stop()

    @property
    def started(self) -> bool:
        return self._consumer is not None

    async def __aenter__(self) -> "TopicReader":
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    @property
    def consumer(self) -> AIOKafkaConsumer:
        if self._consumer is None:
            raise RuntimeError("the topic reader is not started")
        return self._consumer

    # --- what to read ---------------------------------------------------------------------
    async def partitions(self, topic: str, refresh: bool = True) -> list[TopicPartition]:
        """The partitions of ``topic`` by number, from metadata fetched now (``refresh``)
        or as last fetched; [] when the metadata has no such topic."""
        consumer = self.consumer
        if refresh:
            await consumer._client.force_metadata_update()
        parts = consumer._client.cluster.partitions_for_topic(topic) or ()
        return [TopicPartition(topic, p) for p in sorted(parts)]

    async def topics(self) -> set[str]:
        """Every topic's name this login may see, from a metadata request sent now."""
        return await self.consumer.topics()

    async def assign(self, tps: Iterable[TopicPartition], start: Start = None) -> list[TopicPartition]:
        """Read exactly ``tps`` (replacing any earlier assignment), from ``start``."""
        tps = list(tps)
        consumer = self.consumer
        consumer.assign(tps)
        if start == "beginning":
            await consumer.seek_to_beginning(*tps)
        elif start == "end":
            await consumer.seek_to_end(*tps)
        elif start is not None:
            for tp in tps:
                consumer.seek(tp, start)
        return tps

    def subscribe(self, topics: Iterable[str] = (), pattern: str | None = None) -> None:
        """Read ``topics`` or every topic matching ``pattern``: the partitions the group
        gives this member (``group_id``), or all of them without a group."""
        if pattern is not None:
            self.consumer.subscribe(pattern=pattern)
        else:
            self.consumer.subscribe(topics=list(topics))

    def assignment(self) -> set[TopicPartition]:
        return self.consumer.assignment()

    # --- positions ------------------------------------------------------------------------
    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.consumer.seek(tp, offset)

    async def seek_to_beginning(self, *tps: TopicPartition) -> None:
        await self.consumer.seek_to_beginning(*tps)

    async def position(self, tp: TopicPartition) -> int:
        return await self.consumer.position(tp)

    async def beginning_offsets(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return await self.consumer.beginning_offsets(list(tps))

    async def end_offsets(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return await self.consumer.end_offsets(list(tps))

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        """Commit ``offsets`` (each the next offset to read) for the group."""
        await self.consumer.commit(offsets)

    async def committed(self, tp: TopicPartition) -> int | None:
        return await self.consumer.committed(tp)

    # --- reading --------------------------------------------------------------------------
    async def fetch(self, *tps: TopicPartition, timeout_ms: int = 0, max_records: int | None = None) -> Batches:
        """The records fetched so far (of ``tps`` only, when given), waiting up to
        ``timeout_ms`` for some; {} when none came."""
        return await self.consumer.getmany(*tps, timeout_ms=timeout_ms, max_records=max_records)

    async def run(self, handle: Handle, *, max_records: int | None = None, timeout_ms: int = 200,
                  on_fetch_error: OnFetchError | None = None) -> None:
        """Fetch until cancelled, handing each non-empty batch to ``handle`` (awaited
        before the next fetch; what it raises ends the loop). A failed fetch goes to
        ``on_fetch_error``; by default it is logged and fetched again after 0.5 s."""
        consumer = self.consumer
        on_fetch_error = on_fetch_error or self._fetch_failed
        while True:
            try:
                batches = await consumer.getmany(timeout_ms=timeout_ms, max_records=max_records)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                await on_fetch_error(exc)
                continue
            if batches:
                await handle(batches)

    async def _fetch_failed(self, exc: Exception) -> None:
        log.warning("%s: fetch failed (%r); fetching again", self.options.get("client_id", "reader"), exc)
        await asyncio.sleep(0.5)
