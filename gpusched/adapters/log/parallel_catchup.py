"""Parallel catch-up, the follower's side: which partitions are rebuilt through a reader
process (``gpusched.adapters.log.catchup``), and folding the frames it decodes.

A partition assigned with at least ``min_records`` records to fold is held paused in the
follower's consumer while a reader process fetches and decodes its records and this
process folds them; then the consumer takes the partition over from the offset reached,
also when the reader fails. Same events, same order, same dead letters as folding them
with the consumer. Below ``min_records``, starting the reader (~0.3 s) costs more than
it saves.
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
from contextlib import aclosing
from typing import Callable

from aiokafka import AIOKafkaConsumer, TopicPartition

from gpusched.adapters.log import catchup
from gpusched.adapters.log.fold import OnEvent, fold_flat
from gpusched.adapters.log.log_schema import NewerLogSchema
from gpusched.adapters.broker.kafka_security import Where
from gpusched.adapters.log.publisher import DeadLetters
from gpusched.core.state import ClusterState

log = logging.getLogger(__name__)

class CatchUps:
    """The parallel catch-ups of one follower: at most one per partition."""

    def __init__(self, name: str, bootstrap: Where, min_records: int, states: dict[int, ClusterState],
                 dead_letters: DeadLetters, on_event: OnEvent | None, freeze: bool,
                 on_progress: Callable[[int, int], None]) -> None:
        self.name = name
        self.min_records = min_records
        self.runs: dict[int, dict] = {}   # partition -> what its last parallel catch-up did
        self._bootstrap = bootstrap
        self._states = states             # the follower's: a partition whose state was replaced is no longer ours
        self._dead_letters = dead_letters
        self._on_event = on_event
        self._freeze = freeze
        self._on_progress = on_progress   # (partition, offset folded): after each frame
        self._tasks: dict[int, asyncio.Task] = {}
        # One process folds every frame, so readers beyond what keeps it busy only compete
        # for the cores: other partitions far behind wait their turn, paused.
        self._readers = asyncio.Semaphore(max(1, (os.cpu_count() or 2) // 2))

    def running(self, partition: int) -> bool:
        return partition in self._tasks

    async def far_behind(self, consumer: AIOKafkaConsumer,
                         tps: list[TopicPartition]) -> list[tuple[TopicPartition, int]]:
        """The partitions with at least ``min_records`` records to fold, with the end
        offset of the log now."""
        if not self.min_records or not tps:
            return []
        ends = await consumer.end_offsets(tps)
        return [(tp, ends[tp]) for tp in tps
                if ends[tp] - (self._states[tp.partition].offset + 1) >= self.min_records]

    def start(self, consumer: AIOKafkaConsumer, tp: TopicPartition, end: int) -> None:
        """Rebuild the (paused) partition up to ``end`` through a reader process."""
        self._tasks[tp.partition] = asyncio.create_task(
            self._run(consumer, tp, self._states[tp.partition], end), name=f"catch-up-{self.name}-{tp.partition}")

    def cancel(self, partitions: set[int]) -> None:
        for p in partitions:
            task = self._tasks.pop(p, None)
            if task is not None:
                task.cancel()

    async def stop(self) -> None:
        tasks = list(self._tasks.values())
        self.cancel(set(self._tasks))
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _run(self, consumer: AIOKafkaConsumer, tp: TopicPartition, state: ClusterState, end: int) -> None:
        """Fold the partition's records up to ``end`` as a reader process decodes them,
        then hand the partition to the consumer from the offset reached. A failed reader
        only ends this early: the consumer folds the rest, as without a reader."""
        partition, start, t0 = tp.partition, state.offset + 1, time.perf_counter()
        run = self.runs[partition] = {"start": start, "end": end, "folded": 0, "error": ""}
        try:
            async with self._readers, aclosing(catchup.frames(self._bootstrap, tp.topic, partition, start, end)) as stream:
                async for offsets, items in stream:
                    if self._states.get(partition) is not state:
                        return   # revoked meanwhile (closing the stream stops the reader)
                    dead = fold_flat(self.name, tp.topic, partition, state, offsets, items, self._on_event,
                                     self._freeze)
                    run["folded"] += len(items)
                    for record, reason in dead:
                        await self._dead_letters.put(record, reason)
                    self._on_progress(partition, state.offset)
        except asyncio.CancelledError:
            raise
        except NewerLogSchema as exc:   # the consumer folds on from here: it stops the service on that record
            run["error"] = str(exc)
            return
        except Exception as exc:
            run["error"] = repr(exc)
            log.warning("%s: parallel catch-up of partition %d stopped at offset %d (%r); the consumer goes on "
                        "from there", self.name, partition, state.offset, exc)
            return
        finally:
            run["seconds"] = time.perf_counter() - t0
            if self._tasks.get(partition) is asyncio.current_task():
                del self._tasks[partition]
            if self._states.get(partition) is state:   # still ours: the consumer takes over
                consumer.seek(tp, state.offset + 1)
                consumer.resume(tp)
        log.info("%s: partition %d caught up to offset %d in parallel (%d records in %.1f s)",
                 self.name, partition, state.offset, run["folded"], run["seconds"])
