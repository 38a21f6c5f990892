"""The pool log on Kafka: publish events, follow partitions, fold them with the reducer.

- ``EventPublisher`` appends events with ``acks=all`` and idempotence; the partition is
  chosen from the pool so one pool's history is one totally ordered partition.
- ``LogFollower`` reads partitions from the beginning (or a snapshot's offset), decodes
  each record, applies it with the shared reducer to that partition's ``ClusterState``
  and tells the service through a callback. A record it cannot decode goes to the
  dead-letter topic with the reason, and the follower moves on.
- With a ``group_id`` the follower is a consumer-group member: partitions (pools) come
  and go with rebalances, and each newly assigned one is rebuilt from the log.
- With ``use_snapshots`` a partition starts from its latest snapshot (``<prefix>snapshots``,
  see ``gpusched.adapters.snapshots``) and replays only the tail after it. A snapshot that
  cannot be read or decoded is ignored (a warning) and the partition replays from 0.
  ``on_event`` is then called only for the tail: services that build their own state
  from ``on_event`` need every event and should leave snapshots off.
- Replay speed: records are folded in one tight loop per fetched batch (``_fold_records``),
  decoded by the codec's generated builders, and while replaying (big batches) the cyclic
  GC is paused across fetch and fold and runs between batches. With ``freeze_state``
  (services) what a replay batch leaves alive — the state it built — is moved to the GC's
  permanent generation after the batch while a partition rebuilds its state (not once it
  has caught up), so later collections never rescan it.
- Parallel catch-up: a partition assigned with at least ``parallel_replay_min`` records to
  fold is rebuilt through a reader process (``gpusched.adapters.catchup``) that fetches and
  decodes while this process folds; the consumer takes the partition over from the offset
  reached. Same events, same order, same dead letters as folding them here.
"""
from __future__ import annotations

import asyncio
import gc
import heapq
import logging
import os
import time
from contextlib import aclosing
from dataclasses import dataclass
from typing import Awaitable, Callable, NamedTuple

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.partitioner import murmur2

from gpusched.adapters import catchup, codec, flat
from gpusched.adapters.kafka_admin import TopicNames
from gpusched.adapters.kafka_security import Where, client_args
from gpusched.adapters.snapshots import SnapshotStore
from gpusched.adapters.tracing import current_context
from gpusched.core import events as ev
from gpusched.core.reducer import Outcome, apply
from gpusched.core.snapshot import SnapshotError, state_from_snapshot
from gpusched.core.state import ClusterState
from gpusched.v1 import events_pb2

log = logging.getLogger(__name__)
GC_PAUSE_MIN = 1000   # batches at least this big (a replay) are fetched and folded with the cyclic GC paused
# A partition assigned with this many records to fold is rebuilt by a reader process and
# this one in parallel (see gpusched.adapters.catchup); below it, starting the reader
# (~0.3 s) costs more than it saves. GPUSCHED_PARALLEL_REPLAY_MIN overrides it; 0 turns
# parallel catch-up off.
PARALLEL_REPLAY_MIN = 100_000


def parallel_replay_min_from_env() -> int:
    text = os.environ.get("GPUSCHED_PARALLEL_REPLAY_MIN", "")
    if not text:
        return PARALLEL_REPLAY_MIN
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"GPUSCHED_PARALLEL_REPLAY_MIN: {text!r} is not a record count >= 0")
    return value


def partition_for(pool: str, partitions: int) -> int:
    """Kafka's default partitioner (murmur2 of the key), computed here so consumers
    can find their pool's partition without producing first."""
    return (murmur2(pool.encode()) & 0x7FFFFFFF) % partitions


@dataclass(frozen=True, slots=True)
class Position:
    partition: int
    offset: int


# Batching. Every Kafka request costs ~0.2-0.7 ms of CPU in aiokafka, the kernel's
# loopback path and the broker whatever it carries, so at a thousand jobs a second (four
# or five events each, from several producers, read by several followers) requests of
# one or two records would cost more than everything else the services do. A producer
# waits up to LINGER_MS for more records before it sends. A follower picks its fetch
# mode from its partitions' record rate (measured over RATE_WINDOW_S): a quiet log gets
# a plain long poll that returns on the first new record; a busier one asks the broker to
# hold each fetch for up to ``max_wait_ms`` (or until ``min_bytes`` arrived), so one
# fetch carries many records, at the price of at most that wait per hop.
# The steps, measured with bench/submit_bench.py on the 2-core bench host:
# - from 400 records/s: at 200 jobs/s a pool's partition carries ~900 records/s; fetched
#   one by one they cost each follower 25-33 % of a core, the five processes saturated
#   the host and submit->placed p99 went to 0.1-2 s. Held 5 ms (about five records a
#   fetch): p99 35-60 ms, p50 ~20 ms (10 ms: p99 60-83 ms, p50 ~32 ms).
# - from 3,000 records/s (a burst of ~650+ jobs/s): held 20 ms, a node-agent's CPU per
#   job fell from 0.32-0.46 to 0.23-0.27 ms against 5 ms; latency matters less than
#   throughput at that rate.
@dataclass(frozen=True, slots=True)
class FetchMode:
    from_records_per_s: float
    min_bytes: int
    max_wait_ms: int
    # windows in a row the rate must call for this mode (or busier) before it is taken:
    # a stalled follower fetches its backlog in one go, which reads as a burst, and the
    # longer wait would then feed the stall that caused it
    sustained_windows: int = 1


FETCH_MODES = (
    FetchMode(0, 1, 200),              # long poll
    FetchMode(400, 1 << 20, 5),
    FetchMode(3_000, 1 << 20, 20, sustained_windows=3),
)
IDLE_FETCH_WAIT_MS = FETCH_MODES[0].max_wait_ms
RATE_WINDOW_S = 0.1

# A producer's linger by its own send rate (events/s over RATE_WINDOW_S), the same idea
# for writes: 1 ms keeps a quiet producer's records going at once; in a burst 5 ms
# batches more records a request. In bench/submit_bench.py bursts admission sent ~3
# events a produce request with 1 ms; with 5 ms its CPU per job fell from 0.94-0.99 to
# 0.85-0.86 ms, the broker's from 0.55-0.59 to 0.49, and submissions/s rose from
# 689-760 to 864-935. At 200 jobs/s no service sends 600 events/s, so latency there
# keeps the 1 ms linger.
LINGER_MODES = ((0, 1), (600, 5))   # (from events/s, linger ms)
LINGER_MS = LINGER_MODES[0][1]


def linger_for(events_per_s: float) -> int:
    """The linger (ms) of the busiest mode whose threshold the rate reaches."""
    return max((ms for rate, ms in LINGER_MODES if events_per_s >= rate), default=LINGER_MS)


def set_linger(producer: AIOKafkaProducer, linger_ms: int) -> None:
    """aiokafka (0.14, pinned) gives each new batch the accumulator's ``_linger_time``
    and offers no setter; tests/unit/adapters/test_eventlog_batching.py checks that it
    still does."""
    producer._message_accumulator._linger_time = linger_ms / 1000


def fetch_mode_for(records_per_s: float, streak: float = float("inf")) -> FetchMode:
    """The busiest mode whose threshold the rate reaches, among those a streak of that
    many busy windows has earned (by default: all)."""
    mode = FETCH_MODES[0]
    for candidate in FETCH_MODES[1:]:
        if records_per_s >= candidate.from_records_per_s and candidate.sustained_windows <= streak:
            mode = candidate
    return mode


def next_fetch_mode(current: FetchMode, records_per_s: float, streak: int) -> tuple[FetchMode, int]:
    """The mode after a window at this rate, and the new count of windows in a row that
    asked for a busier mode than the current one. Quieter: at once; busier: only as
    busy as the streak allows."""
    wanted = fetch_mode_for(records_per_s)
    if wanted.from_records_per_s <= current.from_records_per_s:
        return wanted, 0
    streak += 1
    mode = max(current, fetch_mode_for(records_per_s, streak), key=lambda m: m.from_records_per_s)
    return mode, (0 if mode == wanted else streak)


def set_fetch_mode(consumer: AIOKafkaConsumer, mode: FetchMode) -> None:
    """aiokafka (0.14, pinned) builds every FetchRequest from these two fetcher attributes
    and offers no public setter; tests/unit/adapters/test_eventlog_batching.py checks
    that it still does."""
    fetcher = consumer._fetcher
    fetcher._fetch_min_bytes = mode.min_bytes
    fetcher._fetch_max_wait_ms = mode.max_wait_ms


class EventPublisher:
    def __init__(self, bootstrap: Where, topics: TopicNames, partitions: int) -> None:
        self.topics = topics
        self.partitions = partitions
        self._producer = AIOKafkaProducer(
            **client_args(bootstrap), acks="all", enable_idempotence=True,
            linger_ms=LINGER_MS, request_timeout_ms=30_000, retry_backoff_ms=100,
        )
        self.linger_ms = LINGER_MS
        self._window = (time.monotonic(), 0)   # (start, events sent since): sets ``linger_ms``

    async def start(self) -> None:
        await self._producer.start()

    async def stop(self) -> None:
        await self._producer.stop()

    async def send(self, event: ev.Event, pool: str) -> asyncio.Future:
        """Queue the event; the returned future resolves when the broker acknowledged it."""
        self._count_send()
        value = codec.encode(event, pool, current_context())
        return await self._producer.send(
            self.topics.events, value, key=pool.encode(),
            partition=partition_for(pool, self.partitions),
        )

    def _count_send(self) -> None:
        """Count sends per RATE_WINDOW_S; once a window is over (checked before this send,
        so the first send after a quiet spell already goes with the quiet linger), take
        the linger its rate calls for."""
        now = time.monotonic()
        start, count = self._window
        if now - start < RATE_WINDOW_S:
            self._window = (start, count + 1)
            return
        self._window = (now, 1)
        linger = linger_for(count / (now - start))
        if linger != self.linger_ms:
            self.linger_ms = linger
            set_linger(self._producer, linger)

    async def publish(self, event: ev.Event, pool: str) -> Position:
        meta = await (await self.send(event, pool))
        return Position(meta.partition, meta.offset)

    async def publish_to(self, event: ev.Event, partition: int) -> Position:
        """An event about a partition's log itself (its ``JobRetentionSet``), not a pool."""
        self._count_send()
        future = await self._producer.send(self.topics.events, codec.encode(event, "", current_context()),
                                           partition=partition)
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
        """Queue a record; the returned future resolves when the broker acknowledged it."""
        return await self._producer.send(topic, value, key=key, partition=partition, headers=headers)


class DeadLetters:
    """Writes records no consumer could apply, with the reason, to the dead-letter topic."""

    def __init__(self, publisher: EventPublisher | None, consumer: str) -> None:
        # None: a read-only consumer (billing, reports), whose principal may not write;
        # it logs the record instead. A pool-log record is dead-lettered by the services
        # that write, which fold the same log.
        self._publisher = publisher
        self._consumer = consumer

    async def put(self, record, reason: str) -> None:
        if self._publisher is None:
            log.warning("%s cannot apply %s[%s]@%s: %s", self._consumer, record.topic, record.partition,
                        record.offset, reason)
            return
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


class DeadRecord(NamedTuple):
    """What ``DeadLetters.put`` reads of a record, for records folded from a catch-up frame."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


# (partition, offset, event, outcome, state)
OnEvent = Callable[[int, int, ev.Event, Outcome, ClusterState], None]
OnPartitions = Callable[[set[int]], Awaitable[None] | None]


class LogFollower:
    # Records per getmany(): larger batches spread the per-call overhead during replay.
    MAX_RECORDS = 20_000

    def __init__(self, bootstrap: Where, topics: TopicNames, name: str, dead_letters: DeadLetters,
                 on_event: OnEvent | None = None, partitions: list[int] | None = None,
                 group_id: str | None = None, on_assigned: OnPartitions | None = None,
                 on_revoked: OnPartitions | None = None, use_snapshots: bool = False,
                 snapshots: SnapshotStore | None = None, freeze_state: bool = False,
                 parallel_replay_min: int | None = None) -> None:
        self.topics = topics
        self.fetch_mode = FETCH_MODES[0]
        self._busier_streak = 0              # see next_fetch_mode
        self._window = (0.0, 0)              # (start, records since): the rate that sets ``fetch_mode``
        self.name = name
        self.states: dict[int, ClusterState] = {}
        # partition -> offset covered by the snapshot its state was loaded from (-1: none)
        self.snapshot_offsets: dict[int, int] = {}
        self.use_snapshots = use_snapshots
        # gc.freeze() after restoring a snapshot (see state_from_snapshot) and after each
        # replay batch while a partition rebuilds: for services, whose state lives as
        # long as the process
        self.freeze_state = freeze_state
        # Partitions rebuilding their state (from 0 or a snapshot) that have not yet
        # reached the end of the log: the only time ``freeze_state`` freezes. Freezing
        # during a live burst measurably hurt: submit->placed went from tens of ms to
        # over a second (the frozen objects of gRPC and asyncio in cycles are never
        # collected), so a live service leaves the GC alone.
        self._catching_up: set[int] = set()
        # Partitions being rebuilt by a reader process (paused in the consumer meanwhile)
        self.parallel_replay_min = (parallel_replay_min_from_env() if parallel_replay_min is None
                                    else parallel_replay_min)
        self._catchups: dict[int, asyncio.Task] = {}
        # One process folds every frame, so readers beyond what keeps it busy only compete
        # for the cores: other partitions far behind wait their turn, paused.
        self._readers = asyncio.Semaphore(max(1, (os.cpu_count() or 2) // 2))
        self.catchup_runs: dict[int, dict] = {}   # partition -> what its last parallel catch-up did
        self.snapshot_loads: dict[int, dict] = {}   # partition -> what its last snapshot load took
        self._snapshots = snapshots
        self._own_snapshots = False
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
        if self.use_snapshots and self._snapshots is None:
            self._snapshots = SnapshotStore(self._bootstrap, self.topics, name=self.name)
            self._own_snapshots = True
        self._consumer = AIOKafkaConsumer(
            **client_args(self._bootstrap), group_id=self._group_id,
            enable_auto_commit=False, auto_offset_reset="earliest",
            fetch_max_wait_ms=IDLE_FETCH_WAIT_MS, max_partition_fetch_bytes=16 * 1024 * 1024,
            fetch_max_bytes=64 * 1024 * 1024,
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
            await self._begin(tps)
        self._task = asyncio.create_task(self._run(), name=f"follow-{self.name}")

    async def _begin(self, tps: list[TopicPartition]) -> None:
        """Fresh state for each partition: its snapshot when enabled and usable, else empty;
        the consumer then reads from right after what the state covers. The partitions
        are paused meanwhile: the fetcher would otherwise fetch (and this loop unpack)
        records from the old position while a snapshot decodes, competing for the CPU."""
        self._consumer.pause(*tps)
        parallel: list[tuple[TopicPartition, int]] = []
        try:
            await self._load_states(tps)
            parallel = await self._far_behind(tps)
        finally:
            held = {tp for tp, _ in parallel}
            self._consumer.resume(*[tp for tp in tps if tp not in held])
        for tp, end in parallel:
            self._catchups[tp.partition] = asyncio.create_task(
                self._catch_up(tp, self.states[tp.partition], end), name=f"catch-up-{self.name}-{tp.partition}")
        self.changed.set()   # a state loaded whole may need no tail: let schedulers look now

    async def _far_behind(self, tps: list[TopicPartition]) -> list[tuple[TopicPartition, int]]:
        """The partitions with at least ``parallel_replay_min`` records to fold, with the
        end offset of the log now."""
        if not self.parallel_replay_min or not tps:
            return []
        ends = await self._consumer.end_offsets(tps)
        return [(tp, ends[tp]) for tp in tps
                if ends[tp] - (self.states[tp.partition].offset + 1) >= self.parallel_replay_min]

    async def _catch_up(self, tp: TopicPartition, state: ClusterState, end: int) -> None:
        """Fold the partition's records up to ``end`` as a reader process decodes them,
        then hand the partition to the consumer from the offset reached. A failed reader
        only ends this early: the consumer folds the rest, as without a reader."""
        partition, start, t0 = tp.partition, state.offset + 1, time.perf_counter()
        run = self.catchup_runs[partition] = {"start": start, "end": end, "folded": 0, "error": ""}
        try:
            async with self._readers, aclosing(catchup.frames(self._bootstrap, tp.topic, partition, start, end)) as stream:
                async for offsets, items in stream:
                    if self.states.get(partition) is not state:
                        return   # revoked meanwhile (closing the stream stops the reader)
                    dead = self._fold_flat(partition, state, offsets, items)
                    run["folded"] += len(items)
                    for record, reason in dead:
                        await self._dead_letters.put(record, reason)
                    self._wake(partition, state.offset)
                    self.changed.set()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            run["error"] = repr(exc)
            log.warning("%s: parallel catch-up of partition %d stopped at offset %d (%r); the consumer goes on "
                        "from there", self.name, partition, state.offset, exc)
            return
        finally:
            run["seconds"] = time.perf_counter() - t0
            if self._catchups.get(partition) is asyncio.current_task():
                del self._catchups[partition]
            if self.states.get(partition) is state:   # still ours: the consumer takes over
                self._consumer.seek(tp, state.offset + 1)
                self._consumer.resume(tp)
        log.info("%s: partition %d caught up to offset %d in parallel (%d records in %.1f s)",
                 self.name, partition, state.offset, run["folded"], run["seconds"])

    def _fold_flat(self, partition: int, state: ClusterState, offsets: list[int], items: list[tuple]) -> list:
        """``_fold_records`` for a catch-up frame: the same fold, on events rebuilt from
        their flat form, with the cyclic GC paused; the records to dead-letter. Written out
        beside it rather than sharing a per-event helper (a call per event is ~0.1 us on
        both replay paths); test_parallel_catchup holds the two to the same callbacks,
        states and dead letters."""
        build, fold, on_event = flat.BUILD_BY_CODE, apply, self._on_event
        topic, last, dead = self.topics.events, state.offset, []
        paused = gc.isenabled()
        if paused:
            gc.disable()
        try:
            for offset, item in zip(offsets, items):
                if offset <= last:
                    continue
                code = item[0]
                if code < 0:   # did not decode: (-1, reason, key, value)
                    state.offset = last = offset
                    dead.append((DeadRecord(topic, partition, offset, item[2], item[3]), item[1]))
                    continue
                event = build[code](item)
                try:
                    outcome = fold(state, event)
                except Exception as exc:  # a reducer bug must not stop the service
                    log.exception("reducer failed on %s:%s", partition, offset)
                    state.offset = last = offset
                    # the reader kept no bytes of a record that decoded: the letter carries
                    # the event encoded again (same fields; the pool is the partition's)
                    dead.append((DeadRecord(topic, partition, offset, None, codec.encode(event, "")),
                                 f"reducer error: {exc!r}"))
                    continue
                state.offset = last = offset
                if on_event is not None:
                    try:
                        on_event(partition, offset, event, outcome, state)
                    except Exception:
                        log.exception("%s: handler failed on %s:%s", self.name, partition, offset)
            if self.freeze_state:
                gc.freeze()   # what the frame built joins the state for good (see _run)
        finally:
            if paused:
                gc.enable()
        return dead

    async def _load_states(self, tps: list[TopicPartition]) -> None:
        from_start = []
        for tp in tps:
            state = await self._load_snapshot(tp) if self.use_snapshots else None
            if state is None:
                self._reset(tp.partition)
                from_start.append(tp)
            else:
                self.states[tp.partition] = state
                self._catching_up.add(tp.partition)
                self.snapshot_offsets[tp.partition] = state.offset
                self._consumer.seek(tp, state.offset + 1)
                self._wake(tp.partition, state.offset)
        if from_start:
            await self._consumer.seek_to_beginning(*from_start)

    async def _load_snapshot(self, tp: TopicPartition) -> ClusterState | None:
        partition = tp.partition
        t0 = time.perf_counter()
        try:
            record = await self._snapshots.read_latest(partition)
        except Exception as exc:
            log.warning("%s: could not read a snapshot of partition %d (%r); replaying from 0",
                        self.name, partition, exc)
            return None
        if record is None:
            log.info("%s: no snapshot of partition %d; replaying from 0", self.name, partition)
            return None
        t1 = time.perf_counter()
        try:
            # decoding is CPU-bound: off the loop, so heartbeats and other partitions go on
            state = await asyncio.get_running_loop().run_in_executor(
                None, state_from_snapshot, record.value, self.freeze_state)
        except SnapshotError as exc:
            log.warning("%s: ignoring the snapshot of partition %d at snapshots offset %d: %s; replaying from 0",
                        self.name, partition, record.offset, exc)
            return None
        end = (await self._consumer.end_offsets([tp]))[tp]
        if state.offset >= end:
            log.warning("%s: ignoring the snapshot of partition %d: it covers offset %d but the log ends at %d "
                        "(a different log?); replaying from 0", self.name, partition, state.offset, end - 1)
            return None
        t2 = time.perf_counter()
        self.snapshot_loads[partition] = {"offset": state.offset, "bytes": len(record.value), "read_s": t1 - t0,
                                          "decode_s": t2 - t1, "tail": end - 1 - state.offset}
        log.info("%s: partition %d from its snapshot at offset %d (%d bytes: read %.0f ms, decoded %.0f ms); "
                 "replaying %d records after it", self.name, partition, state.offset, len(record.value),
                 (t1 - t0) * 1000, (t2 - t1) * 1000, end - 1 - state.offset)
        return state

    async def _fetch_partitions(self) -> set[int]:
        await self._consumer._client.force_metadata_update()
        return self._consumer._client.cluster.partitions_for_topic(self.topics.events) or set()

    def cancel_catchups(self, partitions: set[int]) -> None:
        for p in partitions:
            task = self._catchups.pop(p, None)
            if task is not None:
                task.cancel()

    async def stop(self) -> None:
        tasks = list(self._catchups.values())
        self.cancel_catchups(set(self._catchups))
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
        if self._consumer:
            await self._consumer.stop()
        if self._own_snapshots and self._snapshots is not None:
            await self._snapshots.stop()

    def _reset(self, partition: int) -> None:
        self.states[partition] = ClusterState()   # retention: off until the log sets it
        self.snapshot_offsets[partition] = -1
        self._catching_up.add(partition)

    def lag(self, partition: int) -> int | None:
        """Records in the log (as of the last fetch) not yet folded; None when unknown."""
        state = self.states.get(partition)
        if state is None or self._consumer is None or partition in self._catchups:
            return None
        high = self._consumer.highwater(TopicPartition(self.topics.events, partition))
        return None if high is None else max(0, high - (state.offset + 1))

    def is_caught_up(self, partition: int, slack: int = 0) -> bool:
        """Whether the partition's state covers the log up to its end as last fetched
        (give or take ``slack`` records)."""
        lag = self.lag(partition)
        return lag is not None and lag <= slack

    async def _run(self) -> None:
        consumer = self._consumer
        replaying = False
        while True:
            # Replaying (the last batch was big): the cyclic GC stays paused across the fetch
            # and the fold, and runs between batches. Everything a batch allocates either
            # dies by reference count or joins the state for good, so collecting in the
            # middle of a batch only rescans the growing state: ~25% of replay time.
            paused = replaying and gc.isenabled()
            if paused:
                gc.disable()
            try:
                try:
                    # short: a quiet spell must end batching within a rate window or so
                    batches = await consumer.getmany(timeout_ms=100, max_records=self.MAX_RECORDS)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("%s: fetch failed; retrying", self.name)
                    await asyncio.sleep(0.5)
                    continue
                applied = False
                size = 0
                rebuilt = False
                for tp, records in batches.items():
                    size += len(records)
                    state = self.states.get(tp.partition)
                    if state is None:
                        continue   # revoked while the fetch was in flight
                    if await self._fold_all(state, records):
                        applied = True
                    self._wake(tp.partition, state.offset)
                    if tp.partition in self._catching_up:
                        rebuilt = True
                        if self.is_caught_up(tp.partition):
                            self._catching_up.discard(tp.partition)
                replaying = size >= GC_PAUSE_MIN
                if replaying and rebuilt and self.freeze_state:
                    # Before the GC runs again: otherwise its next collections scan the
                    # batch's survivors, which join the state for good, over and over as
                    # they age (~10% of replay time). Cyclic garbage frozen with them is
                    # never reclaimed; a fold makes none (the state holds no cycles).
                    gc.freeze()
            finally:
                if paused:
                    gc.enable()
            if applied:
                self.changed.set()
            self._measure_rate(size)

    def _measure_rate(self, records: int) -> None:
        """Count records per RATE_WINDOW_S; at the end of each window, switch the fetch
        mode if the rate calls for another one."""
        now = time.monotonic()
        start, count = self._window
        count += records
        if now - start < RATE_WINDOW_S:
            self._window = (start, count)
            return
        mode, self._busier_streak = next_fetch_mode(self.fetch_mode, count / (now - start), self._busier_streak)
        self._window = (now, 0)
        if mode != self.fetch_mode:
            self.fetch_mode = mode
            set_fetch_mode(self._consumer, mode)

    async def _fold_all(self, state: ClusterState, records) -> bool:
        """Fold records in order into ``state``; whether any was new. The replay hot path:
        one tight loop, names bound locally, awaiting only to write a dead letter. A big
        batch is folded with the cyclic GC paused (see ``_run``)."""
        if len(records) < GC_PAUSE_MIN or not gc.isenabled():
            return await self._fold_records(state, records)
        gc.disable()
        try:
            return await self._fold_records(state, records)
        finally:
            gc.enable()

    async def _fold_records(self, state: ClusterState, records) -> bool:
        decode, decode_error, fold = codec.decode, codec.DecodeError, apply
        on_event = self._on_event
        last = state.offset
        folded = False
        for record in records:
            offset = record.offset
            if offset <= last:
                continue
            folded = True
            try:
                event = decode(record.value)[0]
            except decode_error as exc:
                state.offset = last = offset
                await self._dead_letters.put(record, str(exc))
                continue
            try:
                outcome = fold(state, event)
            except Exception as exc:  # a reducer bug must not stop the service
                log.exception("reducer failed on %s:%s", record.partition, offset)
                state.offset = last = offset
                await self._dead_letters.put(record, f"reducer error: {exc!r}")
                continue
            state.offset = last = offset
            if on_event is not None:
                try:
                    on_event(record.partition, offset, event, outcome, state)
                except Exception:
                    log.exception("%s: handler failed on %s:%s", self.name, record.partition, offset)
        return folded

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
        self.f.cancel_catchups(parts)
        for p in parts:
            self.f.states.pop(p, None)
            self.f.snapshot_offsets.pop(p, None)
        if parts and self.f._on_revoked:
            await _maybe_await(self.f._on_revoked(parts))

    async def on_partitions_assigned(self, assigned) -> None:
        parts = {tp.partition for tp in assigned}
        if assigned:
            await self.f._begin(sorted(assigned, key=lambda tp: tp.partition))
        if parts and self.f._on_assigned:
            await _maybe_await(self.f._on_assigned(parts))


async def _maybe_await(result) -> None:
    if asyncio.iscoroutine(result):
        await result
