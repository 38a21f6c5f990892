"""Starting a partition's state from its latest snapshot instead of offset 0.

A snapshot that cannot be read or decoded, or that covers more of the log than the log
holds (another log's), is ignored with a warning: the follower then replays from 0.
Decoding is CPU-bound, so it runs in a worker thread and the loop (heartbeats, other
partitions) goes on.
"""
from __future__ import annotations

import asyncio
import gc
import logging
import time
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, TopicPartition

from gpusched.adapters.log.gc_pacing import gc_paused
from gpusched.adapters.log.snapshots import SnapshotStore
from gpusched.core.snapshot import SnapshotError, state_from_snapshot
from gpusched.core.state import ClusterState

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SnapshotLoad:
    """What restoring a partition from its snapshot took (for logs and benchmarks)."""

    offset: int        # events offset the snapshot covers
    bytes: int
    read_s: float
    decode_s: float
    tail: int          # records in the log after it


def decode_state(data: bytes, freeze: bool = False) -> ClusterState:
    """``state_from_snapshot`` with the cyclic GC paused (it builds millions of small
    containers, none in a cycle, which the GC would rescan again and again). ``freeze``: then move everything
    the process holds, the restored state included, to the GC's permanent generation
    (``gc.freeze``). A restored million-event state is a few million long-lived objects
    that the cyclic GC would otherwise rescan, seconds at a time; they hold no cycles and
    are still freed by reference counting when dropped. For a service, whose state lives
    as long as the process."""
    with gc_paused():
        state = state_from_snapshot(data)
        if freeze:
            gc.freeze()
        return state


async def restore(store: SnapshotStore, consumer: AIOKafkaConsumer, tp: TopicPartition, name: str,
                  freeze: bool) -> tuple[ClusterState, SnapshotLoad] | None:
    """The state of ``tp`` from its latest usable snapshot, and what loading it took;
    None when there is none to use."""
    partition = tp.partition
    t0 = time.perf_counter()
    try:
        record = await store.read_latest(partition)
    except Exception as exc:
        log.warning("%s: could not read a snapshot of partition %d (%r); replaying from 0", name, partition, exc)
        return None
    if record is None:
        log.info("%s: no snapshot of partition %d; replaying from 0", name, partition)
        return None
    t1 = time.perf_counter()
    try:
        state = await asyncio.get_running_loop().run_in_executor(None, decode_state, record.value, freeze)
    except SnapshotError as exc:
        log.warning("%s: ignoring the snapshot of partition %d at snapshots offset %d: %s; replaying from 0",
                    name, partition, record.offset, exc)
        return None
    end = (await consumer.end_offsets([tp]))[tp]
    if state.offset >= end:
        log.warning("%s: ignoring the snapshot of partition %d: it covers offset %d but the log ends at %d "
                    "(a different log?); replaying from 0", name, partition, state.offset, end - 1)
        return None
    t2 = time.perf_counter()
    load = SnapshotLoad(state.offset, len(record.value), t1 - t0, t2 - t1, end - 1 - state.offset)
    log.info("%s: partition %d from its snapshot at offset %d (%d bytes: read %.0f ms, decoded %.0f ms); "
             "replaying %d records after it", name, partition, state.offset, load.bytes,
             load.read_s * 1000, load.decode_s * 1000, load.tail)
    return state, load
