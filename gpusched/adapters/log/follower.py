"""Following the pool log: read partitions, fold them with the reducer, wake waiters.

``LogFollower`` reads partitions from the beginning (or a snapshot's offset), folds each
record with the shared reducer into that partition's ``ClusterState``
(``gpusched.adapters.log.fold``) and tells the service through ``on_event``. A record it
cannot decode goes to the dead-letter topic with the reason, and the follower moves on.

- With a ``group_id`` the follower is a consumer-group member: partitions (pools) come
  and go with rebalances, and each newly assigned one is rebuilt from the log.
- With ``use_snapshots`` a partition starts from its latest snapshot
  (``gpusched.adapters.log.restore``) and replays only the tail after it. ``on_event`` is
  then called only for the tail: services that build their own state from ``on_event``
  need every event and should leave snapshots off.
- A partition far behind is rebuilt through a reader process in parallel
  (``gpusched.adapters.log.parallel_catchup``).
- While replaying (big batches) the cyclic GC is paused across fetch and fold and runs
  between batches (``gc_pacing.gc_paused``). With ``freeze_state`` (services) what a
  replay batch leaves alive, the state it built, is moved to the GC's permanent
  generation while a partition rebuilds its state, so later collections never rescan it.
- The fetch mode follows the record rate (``gpusched.adapters.log.batching``).
"""
from __future__ import annotations

import asyncio
import gc
import heapq
import logging
from dataclasses import dataclass
from typing import Awaitable, Callable

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition

from gpusched.adapters.log.batching import IDLE_FETCH_WAIT_MS, FetchTuner
from gpusched.adapters.log.fold import OnEvent, fold_records
from gpusched.adapters.log.gc_pacing import GC_PAUSE_MIN, gc_paused
from gpusched.adapters.broker.kafka_admin import TopicNames
from gpusched.adapters.broker.kafka_security import Where, client_args
from gpusched.adapters.log.log_schema import NewerLogSchema
from gpusched.adapters.log.parallel_catchup import CatchUps
from gpusched.adapters.log.publisher import DeadLetters, Position
from gpusched.adapters.log.restore import SnapshotLoad, restore
from gpusched.adapters.service import stop_failing
from gpusched.adapters.log.snapshots import SnapshotStore
from gpusched.config import PARALLEL_REPLAY_MIN
from gpusched.core.state import ClusterState

log = logging.getLogger(__name__)

OnPartitions = Callable[[set[int]], Awaitable[None] | None]


@dataclass(frozen=True, slots=True)
class FollowerOptions:
    """How a follower reads the log; the defaults follow every partition of the topic."""

    partitions: tuple[int, ...] | None = None   # without a group: these partitions (None: all)
    group_id: str | None = None                 # a consumer-group member: partitions by rebalance
    use_snapshots: bool = False                 # start each partition from its latest snapshot
    # gc.freeze() after restoring a snapshot and after each replay batch while a partition
    # rebuilds: for services, whose state lives as long as the process
    freeze_state: bool = False
    parallel_replay_min: int = PARALLEL_REPLAY_MIN   # 0: no parallel catch-up


class LogFollower:
    # Records per getmany(): larger batches spread the per-call overhead during replay.
    MAX_RECORDS = 20_000

    def __init__(self, bootstrap: Where, topics: TopicNames, name: str, dead_letters: DeadLetters,
                 options: FollowerOptions = FollowerOptions(), *, on_event: OnEvent | None = None,
                 on_assigned: OnPartitions | None = None, on_revoked: OnPartitions | None = None,
                 snapshots: SnapshotStore | None = None) -> None:
        self.topics = topics
        self.name = name
        self.options = options
        self.states: dict[int, ClusterState] = {}
        # partition -> offset covered by the snapshot its state was loaded from (-1: none)
        self.snapshot_offsets: dict[int, int] = {}
        self.snapshot_loads: dict[int, SnapshotLoad] = {}   # partition -> what its last snapshot load took
        # Partitions rebuilding their state (from 0 or a snapshot) that have not yet
        # reached the end of the log: the only time ``freeze_state`` freezes. Freezing
        # during a live burst hurts latency badly (the frozen objects of gRPC and
        # asyncio in cycles are never collected), so a live service leaves the GC alone.
        self._catching_up: set[int] = set()
        self.catchups = CatchUps(name, bootstrap, options.parallel_replay_min, self.states, dead_letters, on_event,
                                 options.freeze_state, self._progress)
        self.fetch = FetchTuner()
        self._snapshots = snapshots
        self._own_snapshots = False
        self._bootstrap = bootstrap
        self._dead_letters = dead_letters
        self._on_event = on_event
        self._on_assigned = on_assigned
        self._on_revoked = on_revoked
        self._waiters: dict[int, list[tuple[int, int, asyncio.Future]]] = {}
        self._counter = 0
        self._consumer: AIOKafkaConsumer | None = None
        self._task: asyncio.Task | None = None
        self.changed = asyncio.Event()   # set after every batch that applied something

    @property
    def catchup_runs(self) -> dict[int, dict]:
        return self.catchups.runs

    async def start(self) -> None:
        options = self.options
        if options.use_snapshots and self._snapshots is None:
            self._snapshots = SnapshotStore(self._bootstrap, self.topics, name=self.name)
            self._own_snapshots = True
        self._consumer = AIOKafkaConsumer(
            **client_args(self._bootstrap), group_id=options.group_id,
            enable_auto_commit=False, auto_offset_reset="earliest",
            fetch_max_wait_ms=IDLE_FETCH_WAIT_MS, max_partition_fetch_bytes=16 * 1024 * 1024,
            fetch_max_bytes=64 * 1024 * 1024,
            isolation_level="read_uncommitted", client_id=self.name,
            session_timeout_ms=10_000, heartbeat_interval_ms=1_000,
            max_poll_interval_ms=300_000, rebalance_timeout_ms=10_000,
        )
        await self._consumer.start()
        if options.group_id:
            self._consumer.subscribe([self.topics.events], listener=_Rebalance(self))
        else:
            parts = options.partitions
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
            parallel = await self.catchups.far_behind(self._consumer, tps)
        finally:
            held = {tp for tp, _ in parallel}
            self._consumer.resume(*[tp for tp in tps if tp not in held])
        for tp, end in parallel:
            self.catchups.start(self._consumer, tp, end)
        self.changed.set()   # a state loaded whole may need no tail: let schedulers look now

    def _progress(self, partition: int, offset: int) -> None:
        """A catch-up folded a frame."""
        self._wake(partition, offset)
        self.changed.set()

    async def _load_states(self, tps: list[TopicPartition]) -> None:
        from_start = []
        for tp in tps:
            restored = None
            if self.options.use_snapshots:
                restored = await restore(self._snapshots, self._consumer, tp, self.name, self.options.freeze_state)
            if restored is None:
                self._reset(tp.partition)
                from_start.append(tp)
            else:
                state, self.snapshot_loads[tp.partition] = restored
                self.states[tp.partition] = state
                self._catching_up.add(tp.partition)
                self.snapshot_offsets[tp.partition] = state.offset
                self._consumer.seek(tp, state.offset + 1)
                self._wake(tp.partition, state.offset)
        if from_start:
            await self._consumer.seek_to_beginning(*from_start)

    async def _fetch_partitions(self) -> set[int]:
        await self._consumer._client.force_metadata_update()
        return self._consumer._client.cluster.partitions_for_topic(self.topics.events) or set()

    async def stop(self) -> None:
        await self.catchups.stop()
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

    def _forget(self, partitions: set[int]) -> None:
        """Revoked: stop catching up and drop their states."""
        self.catchups.cancel(partitions)
        for p in partitions:
            self.states.pop(p, None)
            self.snapshot_offsets.pop(p, None)

    def lag(self, partition: int) -> int | None:
        """Records in the log (as of the last fetch) not yet folded; None when unknown."""
        state = self.states.get(partition)
        if state is None or self._consumer is None or self.catchups.running(partition):
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
            # Replaying (the last batch was big): the cyclic GC stays paused across the
            # fetch and the fold (see gc_pacing).
            with gc_paused(replaying):
                try:
                    # short: a quiet spell must end batching within a rate window or so
                    batches = await consumer.getmany(timeout_ms=100, max_records=self.MAX_RECORDS)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("%s: fetch failed; retrying", self.name)
                    await asyncio.sleep(0.5)
                    continue
                try:
                    applied, size, rebuilt = await self._fold_batches(batches)
                except NewerLogSchema as exc:   # folds nothing more: the service stops, saying why
                    if not stop_failing(str(exc)):
                        raise
                    return
                replaying = size >= GC_PAUSE_MIN
                if replaying and rebuilt and self.options.freeze_state:
                    # Before the GC runs again: otherwise its next collections scan the
                    # batch's survivors, which join the state for good, over and over as
                    # they age. Cyclic garbage frozen with them is never reclaimed; a fold
                    # makes none (the state holds no cycles).
                    gc.freeze()
            if applied:
                self.changed.set()
            self.fetch.count(consumer, size)

    async def _fold_batches(self, batches: dict) -> tuple[bool, int, bool]:
        """Fold a fetch's records; whether any was new, how many records there were, and
        whether a partition rebuilding its state got some."""
        applied, size, rebuilt = False, 0, False
        for tp, records in batches.items():
            size += len(records)
            state = self.states.get(tp.partition)
            if state is None:
                continue   # revoked while the fetch was in flight
            with gc_paused(len(records) >= GC_PAUSE_MIN):
                if await fold_records(self.name, state, records, self._on_event, self._dead_letters,
                                      live=tp.partition not in self._catching_up):
                    applied = True
            self._wake(tp.partition, state.offset)
            if tp.partition in self._catching_up:
                rebuilt = True
                if self.is_caught_up(tp.partition):
                    self._catching_up.discard(tp.partition)
        return applied, size, rebuilt

    # --- read-your-writes -------------------------------------------------------------
    async def wait_applied(self, pos: Position, timeout: float = 30.0) -> ClusterState:
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
        self.f._forget(parts)
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
