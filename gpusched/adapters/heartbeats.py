"""Listens to the heartbeats topic and remembers when each node was last heard from.

Times are this process's clock at receipt, so agents' clock skew does not matter."""
from __future__ import annotations

import asyncio
import logging
import time

from aiokafka import AIOKafkaConsumer

from gpusched.v1 import events_pb2

log = logging.getLogger(__name__)


class HeartbeatMonitor:
    def __init__(self, bootstrap: str, topic: str) -> None:
        self.last_seen: dict[str, float] = {}
        self.since = time.time()
        self._consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=None,
                                          auto_offset_reset="latest", enable_auto_commit=False)
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        await self._consumer.start()
        self.since = time.time()
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        async for record in self._consumer:
            try:
                beat = events_pb2.Heartbeat.FromString(record.value)
            except Exception:
                log.warning("undecodable heartbeat at %s:%s", record.partition, record.offset)
                continue
            self.last_seen[beat.node] = time.time()

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
        await self._consumer.stop()
