"""What each service replica last measured, read from the usage topic for the autoscaler.

The node-agents' usage records (``usage_records``) carry, for worker 0 of a service's
replica, the requests it had in flight and its counter of requests answered, besides its
GPUs' utilization. ``ReplicaLoads.add`` folds a record into the replica's latest
``ReplicaLoad``: requests a second come from the counter's rise since the replica's
previous record of the same attempt. Entries not refreshed within ``keep_s`` are
dropped, so the map holds the replicas running now. ``ReplicaLoadReader`` reads the topic
from its end (a preemptor needs the present load, not history) into one.
"""
from __future__ import annotations

import asyncio
import logging

from aiokafka.errors import KafkaError

from gpusched.adapters.broker.kafka_admin import TopicNames
from gpusched.adapters.broker.kafka_security import Where
from gpusched.adapters.broker.topic_reader import Batches, TopicReader
from gpusched.adapters.nodes.usage_records import UNMEASURED, UsageRecordError, WorkerUsage, decode_usage
from gpusched.policies.autoscaling import ReplicaLoad

log = logging.getLogger(__name__)


class ReplicaLoads(dict):
    """job id -> ``ReplicaLoad``: a mapping the autoscaler reads as it is."""

    def __init__(self, keep_s: float = 120.0) -> None:
        super().__init__()
        self.keep_s = keep_s
        self._counters: dict[str, tuple[int, float, float]] = {}   # job -> (attempt, time, requests_total)
        self._newest = 0.0

    def add(self, usage: WorkerUsage) -> None:
        if usage.worker != 0:
            return
        per_second = UNMEASURED
        if usage.requests_total != UNMEASURED:
            before = self._counters.get(usage.job_id)
            if before is not None and before[0] == usage.attempt and usage.time > before[1] \
                    and usage.requests_total >= before[2]:
                per_second = (usage.requests_total - before[2]) / (usage.time - before[1])
            self._counters[usage.job_id] = (usage.attempt, usage.time, usage.requests_total)
        measured = [g.sm_percent for g in usage.gpus if g.measured]
        gpu = sum(measured) / len(measured) if measured else UNMEASURED
        self[usage.job_id] = ReplicaLoad(usage.time, usage.requests_in_flight, per_second, gpu)
        if usage.time > self._newest + self.keep_s / 4:
            self._newest = usage.time
            for job_id in [j for j, load in self.items() if load.time < usage.time - self.keep_s]:
                del self[job_id]
                self._counters.pop(job_id, None)


class ReplicaLoadReader:
    """Reads ``<prefix>usage`` from its end into ``loads``; malformed records are skipped
    (the usage report's consumer sends them to the dead letters)."""

    def __init__(self, where: Where, topics: TopicNames, loads: ReplicaLoads | None = None) -> None:
        self.loads = loads if loads is not None else ReplicaLoads()
        self._where, self._topics = where, topics
        self._reader: TopicReader | None = None
        self._task: asyncio.Task | None = None
        self.skipped = 0

    async def start(self) -> None:
        self._reader = await TopicReader(self._where, client_id="replica-loads").start()
        parts = await self._reader.partitions(self._topics.usage)
        await self._reader.assign(parts, "end")
        self._task = asyncio.create_task(self._reader.run(self._fold, on_fetch_error=self._fetch_failed),
                                         name="replica-loads")

    async def _fold(self, batches: Batches) -> None:
        for records in batches.values():
            for record in records:
                try:
                    self.loads.add(decode_usage(record.value or b""))
                except UsageRecordError:
                    self.skipped += 1

    @staticmethod
    async def _fetch_failed(exc: Exception) -> None:
        if not isinstance(exc, KafkaError):
            raise exc
        log.warning("usage fetch failed; retrying", exc_info=exc)
        await asyncio.sleep(0.5)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._reader is not None:
            await self._reader.stop()
