"""Listens to the heartbeats topic and remembers when each node was last heard from.

Times are this process's clock at receipt, so agents' clock skew does not matter. The
monitor also sends its own probe beats through the topic: while they do not come back
(broker restart, our consumer stalled) silence says nothing about the nodes, and when
they resume ``since`` moves forward, so no node is declared lost for a gap that was ours.
"""
from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Awaitable, Callable

from aiokafka import AIOKafkaConsumer

from gpusched.adapters.kafka_security import Where, client_args
from gpusched.v1 import events_pb2

log = logging.getLogger(__name__)


class HeartbeatMonitor:
    def __init__(self, bootstrap: Where, topic: str, send: Callable[[bytes, bytes], Awaitable[None]],
                 blind_after_s: float = 2.0, probe_every_s: float = 0.5) -> None:
        self.last_seen: dict[str, float] = {}
        self.since = time.time()
        self.last_probe = 0.0
        self.blind_after_s = blind_after_s
        self.probe_every_s = probe_every_s
        self._probe_name = f"~monitor-{uuid.uuid4().hex[:8]}"
        self._send = send
        self._consumer = AIOKafkaConsumer(topic, **client_args(bootstrap), group_id=None,
                                          auto_offset_reset="latest", enable_auto_commit=False)
        self._tasks: list[asyncio.Task] = []

    async def start(self) -> None:
        await self._consumer.start()
        self.since = time.time()
        self._tasks = [asyncio.create_task(self._run()), asyncio.create_task(self._probe())]

    def hearing(self, now: float) -> bool:
        """False while our own probes do not come back: no verdicts from silence then."""
        return now - self.last_probe <= self.blind_after_s

    async def _probe(self) -> None:
        beat = events_pb2.Heartbeat(node=self._probe_name)
        while True:
            try:
                beat.time = time.time()
                await self._send(beat.SerializeToString(), self._probe_name.encode())
            except asyncio.CancelledError:
                raise
            except Exception:
                log.debug("probe not sent", exc_info=True)
            await asyncio.sleep(self.probe_every_s)   # the probe's own period

    async def _run(self) -> None:
        while True:
            try:
                async for record in self._consumer:
                    self._note(record)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.warning("heartbeat consumer failed; reconnecting", exc_info=True)
                await asyncio.sleep(1.0)   # back-off before re-reading

    def _note(self, record) -> None:
        try:
            beat = events_pb2.Heartbeat.FromString(record.value)
        except Exception:
            log.warning("undecodable heartbeat at %s:%s", record.partition, record.offset)
            return
        now = time.time()
        if beat.node == self._probe_name:
            if now - self.last_probe > self.blind_after_s:
                self.since = now     # we were deaf: every node gets a fresh timeout
            self.last_probe = now
            return
        self.last_seen[beat.node] = now

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await self._consumer.stop()
