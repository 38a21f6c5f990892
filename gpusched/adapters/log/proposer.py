"""The loop shared by services that append decisions to pool logs (placer, preemptor).

After the log moves (or every ``idle_wake_s``), ask ``decide`` for each owned partition
and append what it returns. A partition is decided on only once its replay has caught
up, and never while the previous decisions are still on their way back through the log:
each round sees its own earlier proposals, so it does not propose the same thing twice.
If two replicas overlap during a rebalance, the reducer rejects the loser's proposals.

``busy_share`` paces the rounds: after a round that took ``t`` seconds the loop rests
``t * (1 / busy_share - 1)`` before the next, so the decider keeps at most that share of
the time. During a burst the log moves after every fetch, and a decider whose round scans
the pool per pending job (the preemptor's) would otherwise run back to back, taking the
CPU from the placer and the relay; on a quiet cluster rounds take milliseconds and the
rest is as short. What changed meanwhile is seen by the next round.
"""
from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import Callable

from gpusched.adapters.log.follower import LogFollower
from gpusched.adapters.log.publisher import EventPublisher
from gpusched.core import events as ev
from gpusched.core.state import ClusterState

log = logging.getLogger(__name__)
Decide = Callable[[int, ClusterState, float], list[tuple[ev.Event, str]]]


class PartitionProposer:
    def __init__(self, follower: LogFollower, publisher: EventPublisher, decide: Decide, name: str,
                 idle_wake_s: float = 0.5, busy_share: float = 1.0) -> None:
        self.follower = follower
        self.publisher = publisher
        self.decide = decide
        self.name = name
        self.idle_wake_s = idle_wake_s
        if not 0 < busy_share <= 1:
            raise ValueError(f"busy_share must be in (0, 1], not {busy_share}")
        self.busy_share = busy_share
        self.rounds = 0
        self.ready_at: dict[int, int] = {}     # partition -> log end when assigned
        self.inflight: dict[int, float] = {}   # partition -> offset of our last proposal
        self.proposed = 0

    async def on_assigned(self, partitions: set[int]) -> None:
        ends = await self.follower.end_positions()
        for p in partitions:
            self.ready_at[p] = ends.get(p, -1)
            self.inflight.pop(p, None)
        log.info("%s owns partitions %s", self.name, sorted(self.follower.states))

    def on_revoked(self, partitions: set[int]) -> None:
        for p in partitions:
            self.ready_at.pop(p, None)
        log.info("%s gave up partitions %s", self.name, sorted(partitions))

    async def run(self, stop: asyncio.Event) -> None:
        rested = time.monotonic()   # when the next round may start
        while not stop.is_set():
            try:
                await asyncio.wait_for(self.follower.changed.wait(), self.idle_wake_s)
            except asyncio.TimeoutError:
                pass
            await asyncio.sleep(max(0.0, rested - time.monotonic()))
            started = time.monotonic()
            self.rounds += 1
            self.follower.changed.clear()
            for partition in list(self.follower.states):
                try:
                    await self._round(partition)
                except Exception:
                    log.exception("%s: round failed on partition %d", self.name, partition)
                    self.inflight.pop(partition, None)
            ended = time.monotonic()
            rested = ended + (ended - started) * (1 / self.busy_share - 1)

    async def _round(self, partition: int) -> None:
        state = self.follower.states.get(partition)
        if state is None or partition not in self.ready_at or state.offset < self.ready_at[partition]:
            return
        if state.offset < self.inflight.get(partition, -1):
            return
        events = self.decide(partition, state, time.time())
        if not events:
            return
        self.inflight[partition] = math.inf
        positions = await self.publisher.publish_all(events)
        self.inflight[partition] = max(p.offset for p in positions)
        self.proposed += len(events)
