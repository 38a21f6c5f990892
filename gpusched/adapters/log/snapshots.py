"""State snapshots on Kafka: the compacted ``<prefix>snapshots`` topic.

A snapshot of events partition ``p`` is written with key ``b"p"`` to partition ``p`` of
the snapshots topic (same number: it has as many partitions as the events topic), so
compaction keeps the latest snapshot of every pool log. Reading takes the last record
with that key, found by reading the partition backwards from its end in growing windows
(the last record is almost always the one: reading the whole partition from the start
would mean reading every snapshot not compacted away yet, gigabytes on a busy cluster).

Values are ``gpusched.core.snapshot`` bytes (already zlib-compressed, so the producer
does not compress again). They can be tens of MiB: the producer allows
``MAX_SNAPSHOT_BYTES`` per request and the topic is created with the same
``max.message.bytes`` (``kafka_admin.topic_specs``). The headers carry the offset the
snapshot covers and who wrote it, for operators; readers trust only the value.

``SnapshotWriter`` is the placer's side: it snapshots each partition the follower owns
every N folded events or T seconds (whichever first, once the partition has caught up
with the log), copying the state synchronously on the event loop (consistent: the
follower folds on the same loop; only mutable parts are copied) and encoding it (JSON +
zlib, the bulk of the work) in a worker thread, or the whole encoding in a forked child
(``forked_snapshot``, the default where fork exists).

Both steps build millions of small containers, none of them in a cycle: with the cyclic
GC running, it would rescan them again and again (roughly halving the speed), so
``capture_state`` and ``encode_state`` pause it.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError, MessageSizeTooLargeError

from gpusched.adapters.log.forked_snapshot import CAN_FORK, snapshot_bytes_forked
from gpusched.adapters.log.gc_pacing import gc_paused
from gpusched.adapters.broker.kafka_admin import TopicNames
from gpusched.adapters.broker.kafka_security import Where, client_args
from gpusched.adapters.broker.topic_reader import TopicReader
from gpusched.core.snapshot import Captured, capture, encode_captured
from gpusched.core.state import ClusterState

log = logging.getLogger(__name__)

MAX_SNAPSHOT_BYTES = 64 * 1024 * 1024
OFFSET_HEADER = "gpusched-snapshot-offset"
WRITER_HEADER = "gpusched-snapshot-writer"
CAUGHT_UP_SLACK = 5_000   # records behind the log end that still count as caught up (not replaying)


def capture_state(state: ClusterState) -> Captured:
    """``capture`` with the cyclic GC paused: on the loop, consistent with the folds."""
    with gc_paused():
        return capture(state)


def encode_state(captured: Captured) -> bytes:
    """``encode_captured`` with the cyclic GC paused: anywhere, e.g. a worker thread."""
    with gc_paused():
        return encode_captured(captured)


@dataclass(frozen=True, slots=True)
class SnapshotRecord:
    partition: int        # events partition it summarises
    offset: int           # its position in the snapshots partition
    value: bytes
    covers: int = -1      # events offset it covers, from the header (-1 if absent); informational


@dataclass(frozen=True, slots=True)
class Written:
    partition: int
    offset: int
    size: int


class SnapshotStore:
    """Reads and writes the latest snapshot per events partition."""

    def __init__(self, bootstrap: Where, topics: TopicNames, name: str = "snapshots",
                 max_bytes: int = MAX_SNAPSHOT_BYTES) -> None:
        self.topics = topics
        self.name = name
        self._bootstrap = bootstrap
        self._max_bytes = max_bytes
        self._producer: AIOKafkaProducer | None = None
        self._reader: TopicReader | None = None
        self._read_lock = asyncio.Lock()
        self._write_lock = asyncio.Lock()
        self._partitions: int | None = None

    async def start(self) -> None:
        """Optional: connections are opened on first use anyway."""
        await self._get_reader()

    async def stop(self) -> None:
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None
        if self._reader is not None:
            await self._reader.stop()
            self._reader = None

    @staticmethod
    def key(partition: int) -> bytes:
        return str(partition).encode()

    async def _get_reader(self) -> TopicReader:
        if self._reader is None:
            reader = TopicReader(
                self._bootstrap, client_id=f"{self.name}-reader", fetch_max_bytes=self._max_bytes + 1024 * 1024,
                max_partition_fetch_bytes=self._max_bytes + 1024 * 1024, fetch_max_wait_ms=50,
                isolation_level="read_uncommitted",
            )
            await reader.start()
            self._reader = reader
        return self._reader

    async def _snapshot_partition(self, partition: int) -> int:
        """The snapshots partition for an events partition: the same number (falling back to
        modulo for a snapshots topic created with fewer partitions; keys keep them apart)."""
        if self._partitions is None:
            reader = await self._get_reader()
            parts = await reader.partitions(self.topics.snapshots, refresh=False)
            if not parts:
                parts = await reader.partitions(self.topics.snapshots)
            if not parts:
                raise RuntimeError(f"topic {self.topics.snapshots} not found")
            self._partitions = len(parts)
        if partition >= self._partitions:
            log.warning("%s has %d partitions, fewer than events partition %d needs; sharing",
                        self.topics.snapshots, self._partitions, partition)
        return partition % self._partitions

    # --- writing --------------------------------------------------------------------------
    async def write(self, partition: int, value: bytes, offset: int = -1) -> Written:
        """Append a snapshot of events partition ``partition`` covering ``offset``."""
        async with self._write_lock:
            if self._producer is None:
                producer = AIOKafkaProducer(
                    **client_args(self._bootstrap), acks="all", enable_idempotence=True,
                    max_request_size=self._max_bytes, request_timeout_ms=60_000, linger_ms=0,
                    client_id=f"{self.name}-writer",
                )
                try:
                    await producer.start()
                except BaseException:
                    await producer.stop()   # no unclosed client left behind
                    raise
                self._producer = producer
            target = await self._snapshot_partition(partition)
            headers = [(OFFSET_HEADER, str(offset).encode()), (WRITER_HEADER, self.name.encode())]
            try:
                meta = await self._producer.send_and_wait(self.topics.snapshots, value, key=self.key(partition),
                                                          partition=target, headers=headers)
            except MessageSizeTooLargeError:
                log.error("snapshot of partition %d is %d bytes: over the producer's max_request_size or the "
                          "topic's max.message.bytes (topics created before snapshots need "
                          "max.message.bytes=%d)", partition, len(value), self._max_bytes)
                raise
            return Written(meta.partition, meta.offset, len(value))

    # --- reading --------------------------------------------------------------------------
    async def read_latest(self, partition: int, timeout: float = 30.0) -> SnapshotRecord | None:
        """The last snapshot record keyed for events partition ``partition``, or None."""
        async with self._read_lock:
            return await asyncio.wait_for(self._read_latest(partition), timeout)

    async def _read_latest(self, partition: int) -> SnapshotRecord | None:
        reader = await self._get_reader()
        tp = TopicPartition(self.topics.snapshots, await self._snapshot_partition(partition))
        await reader.assign([tp])
        begin = (await reader.beginning_offsets([tp]))[tp]
        end = (await reader.end_offsets([tp]))[tp]
        key = self.key(partition)
        window, stop = 1, end
        while stop > begin:
            start = max(begin, stop - window)
            last = None        # the last record with our key in [start, stop), tombstones included
            reader.seek(tp, start)
            position, idle = start, 0
            while position < stop and idle < 3:
                batch = await reader.fetch(tp, timeout_ms=1000, max_records=max(window, 16))
                for record in batch.get(tp, ()):
                    if record.offset >= stop:
                        break
                    if record.key == key:
                        last = record
                now = await reader.position(tp)
                idle = idle + 1 if now == position else 0   # control records or a gap: give up on the window
                position = now
            if last is not None:
                if last.value is None:   # a tombstone: the key was deleted
                    return None
                covers = -1
                for name, value in last.headers or ():
                    if name == OFFSET_HEADER:
                        try:
                            covers = int(value)
                        except ValueError:
                            pass
                return SnapshotRecord(partition, last.offset, last.value, covers)
            stop, window = start, window * 4
        return None


class SnapshotWriter:
    """Snapshots the partitions a ``LogFollower`` holds, every ``every_events`` folded
    events or ``every_s`` seconds since the last one (0 turns that trigger off).

    A partition is snapshotted only when it has caught up with the log as last fetched
    (not mid-replay: a partition catching up would otherwise pay for one snapshot per N
    events of its own replay) and has moved since the last snapshot. The state is taken
    between two folds, so it is one log prefix exactly: by a forked child that encodes
    its copy-on-write image (``fork``, the default where the OS has it; see
    forked_snapshot), or by a copy on the event loop (``capture``) encoded in a worker
    thread."""

    def __init__(self, follower, store: SnapshotStore, every_events: int = 50_000,
                 every_s: float = 60.0, check_s: float = 1.0, fork: bool = True) -> None:
        self.follower = follower
        self.fork = fork and CAN_FORK           # no os.fork (not POSIX): the thread path
        self.store = store
        self.every_events = every_events
        self.every_s = every_s
        self.check_s = check_s
        self._last: dict[int, tuple[int, float]] = {}   # partition -> (offset covered, when)
        self._failed: dict[int, float] = {}              # partition -> when its last write failed
        self.retry_s = max(every_s, 30.0)                # wait after a failed write (e.g. too large)
        self.written: list[dict] = []                   # recent write stats, for logs/tests

    @property
    def enabled(self) -> bool:
        return self.every_events > 0 or self.every_s > 0

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), self.check_s)
            except asyncio.TimeoutError:
                pass
            if stop.is_set():
                break
            for partition in list(self.follower.states):
                try:
                    await self.maybe_snapshot(partition)
                except asyncio.CancelledError:
                    raise
                except KafkaError as exc:   # the broker away: gpusched.broker says so once
                    self._failed[partition] = time.monotonic()
                    log.warning("snapshot of partition %d not written (%s); next try in %.0f s", partition,
                                type(exc).__name__, self.retry_s)
                except Exception:
                    self._failed[partition] = time.monotonic()
                    log.exception("snapshot of partition %d failed; next try in %.0f s", partition, self.retry_s)

    def due(self, partition: int, state: ClusterState, now: float) -> bool:
        if not self.enabled or state.offset < 0:
            return False
        last = self._last.get(partition)
        if last is None:   # first sight: count from the snapshot it was loaded from, if any
            loaded = self.follower.snapshot_offsets.get(partition, -1)
            last = self._last[partition] = (loaded, now)
        covered, when = last
        if now - self._failed.get(partition, -self.retry_s) < self.retry_s:
            return False
        # "caught up" give or take what a busy pool appends between two fetches
        if state.offset <= covered or not self.follower.is_caught_up(partition, slack=CAUGHT_UP_SLACK):
            return False
        return ((self.every_events > 0 and state.offset - covered >= self.every_events)
                or (self.every_s > 0 and now - when >= self.every_s))

    async def maybe_snapshot(self, partition: int) -> dict | None:
        state = self.follower.states.get(partition)
        now = time.monotonic()
        if state is None or not self.due(partition, state, now):
            return None
        return await self.snapshot(partition, state)

    async def snapshot(self, partition: int, state: ClusterState) -> dict:
        offset, jobs = state.offset, len(state.jobs)
        t1 = time.perf_counter()
        if self.fork:
            value, copy_s = await snapshot_bytes_forked(state)
        else:
            captured = capture_state(state)    # synchronous: no fold can interleave
            copy_s = time.perf_counter() - t1
            value = await asyncio.get_running_loop().run_in_executor(None, encode_state, captured)
            del captured
        encode_s = time.perf_counter() - t1 - copy_s
        t2 = time.perf_counter()
        written = await self.store.write(partition, value, offset)
        stats = {"partition": partition, "offset": offset, "bytes": len(value), "jobs": jobs,
                 "copy_s": copy_s, "encode_s": encode_s, "write_s": time.perf_counter() - t2,
                 "at": written.offset}
        self._last[partition] = (offset, time.monotonic())
        self.written = (self.written + [stats])[-20:]
        log.info("snapshot of partition %d at offset %d: %d bytes, %d jobs; loop blocked %.0f ms %s, "
                 "%.0f ms serialising in %s, %.0f ms writing", partition, offset, len(value), jobs,
                 copy_s * 1000, "forking" if self.fork else "copying", encode_s * 1000,
                 "a child process" if self.fork else "a thread", stats["write_s"] * 1000)
        return stats

    async def flush(self, timeout: float = 15.0) -> None:
        """On a clean stop: snapshot every caught-up partition that moved since its last
        snapshot, so whoever takes it over replays (almost) nothing."""
        async def all_partitions() -> None:
            for partition, state in list(self.follower.states.items()):
                covered = self._last.get(partition, (self.follower.snapshot_offsets.get(partition, -1), 0.0))[0]
                if state.offset > covered and self.follower.is_caught_up(partition, slack=CAUGHT_UP_SLACK):
                    await self.snapshot(partition, state)
        if not self.enabled:
            return
        try:
            await asyncio.wait_for(all_partitions(), timeout)
        except Exception:
            log.exception("final snapshots failed")

    def forget(self, partitions: set[int]) -> None:
        """Partitions given up: their next owner keeps its own schedule."""
        for p in partitions:
            self._last.pop(p, None)
            self._failed.pop(p, None)
