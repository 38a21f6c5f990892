"""The agent's reader of its node's work view (``--source view``; docs/design/design.md, "The
per-node work view"): it reads ``<prefix>work.<node>`` from the beginning, so its cost
follows this node's work, not the pool's event rate.

It offers what the agent reads of a ``LogFollower``: ``states`` (one state holding only
this node's jobs), ``caught_up``, ``start`` and ``stop``; each new record is handed to
``on_change(key, doc)``. A record that does not decode goes to the dead-letter topic.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Callable

from aiokafka import TopicPartition

from gpusched.adapters.broker.kafka_admin import TopicNames
from gpusched.adapters.broker.kafka_security import Where
from gpusched.adapters.log.publisher import DeadLetters
from gpusched.adapters.broker.topic_reader import Batches, TopicReader
from gpusched.adapters.telemetry import tracing
from gpusched.adapters.nodes.work_view import NodeView, ViewDecodeError, decode_record, work_topic

log = logging.getLogger("gpusched.node_agent")
# How long the broker holds a fetch of the view while no record comes. It answers a fetch
# with ``fetch_min_bytes`` (1) as soon as a record is appended, and this consumer's one
# partition is in every fetch once its records are handed out (aiokafka leaves out only
# partitions with records not yet consumed, and those of a broker with a fetch in
# flight), so the wait delays nothing: it only sets how many empty fetches an idle node
# costs the broker (2 a second).
FETCH_WAIT_MS = 500


class WorkSource:
    def __init__(self, bootstrap: Where, topics: TopicNames, node: str, name: str, dead_letters: DeadLetters,
                 on_change: Callable[[str, dict], None]) -> None:
        self.view = NodeView()
        self.states = {0: self.view.state}
        self.name = name
        self.records = 0                       # records read (the bench's count)
        self._tp = TopicPartition(work_topic(topics.prefix, node), 0)
        self._bootstrap = bootstrap
        self._dead_letters = dead_letters
        self._on_change = on_change
        self._reader: TopicReader | None = None
        self._task: asyncio.Task | None = None
        self._position = 0
        self._moved = asyncio.Event()

    async def start(self) -> None:
        self._reader = TopicReader(self._bootstrap, client_id=self.name, auto_offset_reset="earliest",
                                   fetch_max_wait_ms=FETCH_WAIT_MS)
        await self._reader.start()
        await self._reader.assign([self._tp], "beginning")
        self._task = asyncio.create_task(self._run(), name=f"work-view-{self.name}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._reader is not None:
            await self._reader.stop()

    async def caught_up(self, timeout: float = 120.0) -> None:
        """Wait until every record in the view when called has been applied."""
        end = (await self._reader.end_offsets([self._tp]))[self._tp]
        async with asyncio.timeout(timeout):
            while self._position < end:
                self._moved.clear()
                await self._moved.wait()

    async def _run(self) -> None:
        await self._reader.run(self._apply_batches, max_records=1000, on_fetch_error=self._fetch_failed)

    async def _fetch_failed(self, exc: Exception) -> None:
        log.error("%s: reading the work view failed; retrying", self.name, exc_info=exc)
        await asyncio.sleep(0.5)

    async def _apply_batches(self, batches: Batches) -> None:
        for records in batches.values():
            for record in records:
                await self._apply(record)
                self._position = record.offset + 1
        self._moved.set()

    async def _apply(self, record) -> None:
        self.records += 1
        try:
            key = (record.key or b"").decode()
            doc = decode_record(record.value, record.headers)
            if not self.view.apply(key, doc):
                return   # rewritten by a restarted writer: applied already
        except (UnicodeDecodeError, ViewDecodeError) as exc:
            log.warning("%s: work-view record at offset %d: %s", self.name, record.offset, exc)
            await self._dead_letters.put(record, f"work-view record does not decode: {exc}")
            return
        tracing.view_consumed(record, doc)
        self._on_change(key, doc)
