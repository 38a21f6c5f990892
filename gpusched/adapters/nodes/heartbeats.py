"""Listens to the nodes' heartbeat topics and remembers when each node was last heard from.

Each agent beats on ``<prefix>beats.<node>``, which only its own principal may write, so
the node a beat is about is taken from the topic's name (the broker authenticated the
writer), never from the beat: one node's login cannot keep another node alive. A node host
beats for all its nodes in one ``HostBeats`` record on ``<prefix>hostbeats.<host>``; only
the nodes it may speak for (``<host>-...``) are heard from it. The
monitor reads them itself, by pattern (a new node's topic is found within
``METADATA_MAX_AGE_MS``), so liveness does not depend on the relay being up.

Times are this process's clock at receipt, so agents' clock skew does not matter. The
monitor also sends its own probe beats through ``<prefix>heartbeats`` (read by the same
consumer): while they do not come back (broker restart, our consumer stalled) silence
says nothing about the nodes, and when they resume ``since`` moves forward, so no node
is declared lost for a gap that was ours.
"""
from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid
from typing import Awaitable, Callable

from gpusched.adapters.broker.kafka_admin import TopicNames
from gpusched.adapters.broker.kafka_security import Where
from gpusched.adapters.nodes.reports import BEATS, HOST_BEATS, hosted_by, node_of_topic
from gpusched.adapters.broker.topic_reader import Batches, TopicReader
from gpusched.v1 import events_pb2

log = logging.getLogger(__name__)
METADATA_MAX_AGE_MS = 1000   # how soon a new node's beats topic is read


def beats_pattern(topics: TopicNames) -> str:
    """Every node's beats topic of a deployment, and the probes' ``<prefix>heartbeats``."""
    return "^" + re.escape(topics.prefix) + "(" + re.escape(topics.heartbeats[len(topics.prefix):]) \
        + "|(" + re.escape(BEATS) + "|" + re.escape(HOST_BEATS) + r")[A-Za-z0-9._-]+)$"


class HeartbeatMonitor:
    def __init__(self, bootstrap: Where, topics: TopicNames, send: Callable[[bytes, bytes], Awaitable[None]],
                 blind_after_s: float = 2.0, probe_every_s: float = 0.5) -> None:
        self.topics = topics
        self.last_seen: dict[str, float] = {}
        self.refused = 0   # beats naming another node than their topic's
        self.since = time.time()
        self.last_probe = 0.0
        self.blind_after_s = blind_after_s
        self.probe_every_s = probe_every_s
        self._probe_name = f"~monitor-{uuid.uuid4().hex[:8]}"
        self._send = send
        self._reader = TopicReader(bootstrap, auto_offset_reset="latest", metadata_max_age_ms=METADATA_MAX_AGE_MS)
        self._tasks: list[asyncio.Task] = []

    async def start(self) -> None:
        await self._reader.start()
        self._reader.subscribe(pattern=beats_pattern(self.topics))
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
        await self._reader.run(self._note_batches, on_fetch_error=self._failed)

    async def _note_batches(self, batches: Batches) -> None:
        for records in batches.values():
            for record in records:
                try:
                    self._note(record)
                except Exception as exc:
                    await self._failed(exc)

    async def _failed(self, exc: Exception) -> None:
        log.warning("heartbeat consumer failed; reconnecting", exc_info=exc)
        await asyncio.sleep(1.0)   # back-off before re-reading

    def _note(self, record) -> None:
        host = node_of_topic(self.topics.prefix, record.topic, HOST_BEATS)
        if host:
            self._note_host(host, record)
            return
        try:
            beat = events_pb2.Heartbeat.FromString(record.value)
        except Exception:
            log.warning("undecodable heartbeat at %s:%s", record.partition, record.offset)
            return
        now = time.time()
        if record.topic == self.topics.heartbeats:
            if beat.node == self._probe_name:   # another monitor's probe says nothing of ours
                if now - self.last_probe > self.blind_after_s:
                    self.since = now     # we were deaf: every node gets a fresh timeout
                self.last_probe = now
            return
        node = node_of_topic(self.topics.prefix, record.topic, BEATS)
        if beat.node != node:
            self.refused += 1
            log.warning("heartbeat naming node %r on the beats topic of node %r: ignored", beat.node, node)
            return
        self.last_seen[node] = now

    def _note_host(self, host: str, record) -> None:
        """One record of a node host's beats: every node in it it may speak for is heard now."""
        try:
            beats = events_pb2.HostBeats.FromString(record.value)
        except Exception:
            log.warning("undecodable host heartbeat at %s:%s", record.partition, record.offset)
            return
        now = time.time()
        for beat in beats.beats:
            if hosted_by(host, beat.node):
                self.last_seen[beat.node] = now
            else:
                self.refused += 1
                log.warning("heartbeat naming node %r on the beats topic of host %r: ignored", beat.node, host)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await self._reader.stop()
