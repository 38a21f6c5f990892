"""What ``publisher.DeadLetters`` needs to write one letter per bad record and to say so
without flooding the log: the keys the dead-letter topic already holds, and warnings
limited per minute (docs/design/architecture.md, "Dead letters")."""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable

from aiokafka import TopicPartition

from gpusched.adapters.broker.kafka_security import Where
from gpusched.adapters.broker.topic_reader import TopicReader

WARNINGS_PER_MINUTE = 10


def letter_key(topic: str, partition: int, offset: int) -> bytes:
    """One record's letter key: the same whoever writes it, so a second writer can tell."""
    return f"{topic}:{partition}:{offset}".encode()


class LetterIndex:
    """The keys of the letters on the dead-letter topic, read up to its end before each
    check: a record that this writer before a restart, or another replica of it during a
    rebalance, already dead-lettered is not written again. Read only when a bad record
    turns up, from where the last check stopped."""

    def __init__(self, bootstrap: Where, topic: str) -> None:
        self._bootstrap = bootstrap
        self._topic = topic
        self._reader: TopicReader | None = None
        self._partitions: list[TopicPartition] = []
        self._keys: set[bytes] = set()
        self._lock = asyncio.Lock()

    async def holds(self, key: bytes) -> bool:
        async with self._lock:
            await self._read_to_end()
            return key in self._keys

    def add(self, key: bytes) -> None:
        self._keys.add(key)

    async def _read_to_end(self) -> None:
        if self._reader is None:
            reader = await TopicReader(self._bootstrap).start()
            parts = await reader.partitions(self._topic) or [TopicPartition(self._topic, 0)]
            self._partitions = await reader.assign(parts, "beginning")
            self._reader = reader
        reader = self._reader
        ends = await reader.end_offsets(self._partitions)
        for tp in self._partitions:
            while await reader.position(tp) < ends[tp]:
                batches = await reader.fetch(tp, timeout_ms=1000)
                for records in batches.values():
                    self._keys.update(r.key for r in records if r.key)

    async def stop(self) -> None:
        if self._reader is not None:
            await self._reader.stop()
            self._reader = None


class WarningLimit:
    """At most ``per_window`` warnings a window; past it, one line when the next window
    begins, saying how many were not logged one by one."""

    def __init__(self, logger: logging.Logger, what: str, per_window: int = WARNINGS_PER_MINUTE,
                 window_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._log = logger
        self._what = what
        self._per_window = per_window
        self._window_s = window_s
        self._clock = clock
        self._start = clock()
        self._logged = 0
        self._held_back = 0

    def warn(self, message: str, *args) -> None:
        now = self._clock()
        if now - self._start >= self._window_s:
            if self._held_back:
                self._log.warning("%s: %d more not logged one by one in the last %.0fs (at most %d lines a "
                                  "window)", self._what, self._held_back, now - self._start, self._per_window)
            self._start, self._logged, self._held_back = now, 0, 0
        if self._logged < self._per_window:
            self._logged += 1
            self._log.warning(message, *args)
        else:
            self._held_back += 1
