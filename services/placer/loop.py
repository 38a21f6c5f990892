"""The placer's cycle loop: after the log moves, schedule each owned pool and append
the decisions as ``JobPlaced`` proposals.

A pool is scheduled only once its replay has caught up, and never while its previous
proposals are still on their way back through the log: each cycle sees its own earlier
decisions, so it does not propose the same job twice. If two placers overlap during a
rebalance, the reducer rejects the loser's proposals.
"""
from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid

from opentelemetry import trace

from gpusched.adapters.eventlog import EventPublisher, LogFollower
from gpusched.core import events as ev
from gpusched.policies.scheduler import Scheduler

log = logging.getLogger("gpusched.placer")
tracer = trace.get_tracer("gpusched.placer")
IDLE_WAKE_S = 0.5   # re-run cycles this often anyway: retry back-offs expire with time


class PlacerLoop:
    def __init__(self, follower: LogFollower, publisher: EventPublisher, scheduler: Scheduler, me: str) -> None:
        self.follower = follower
        self.publisher = publisher
        self.scheduler = scheduler
        self.me = me
        self.ready_at: dict[int, int] = {}     # partition -> log end when assigned
        self.inflight: dict[int, float] = {}   # partition -> offset of our last proposal
        self.last_version: dict[int, int] = {}
        self.decisions = 0

    async def on_assigned(self, partitions: set[int]) -> None:
        ends = await self.follower.end_positions()
        for p in partitions:
            self.ready_at[p] = ends.get(p, -1)
            self.inflight.pop(p, None)
            self.last_version.pop(p, None)
        log.info("%s owns partitions %s", self.me, sorted(self.follower.states))

    def on_revoked(self, partitions: set[int]) -> None:
        for p in partitions:
            self.ready_at.pop(p, None)
        log.info("%s gave up partitions %s", self.me, sorted(partitions))

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await asyncio.wait_for(self.follower.changed.wait(), IDLE_WAKE_S)
            except asyncio.TimeoutError:
                pass
            self.follower.changed.clear()
            for partition in list(self.follower.states):
                try:
                    await self._schedule(partition)
                except Exception:
                    log.exception("cycle failed on partition %d", partition)
                    self.inflight.pop(partition, None)

    async def _schedule(self, partition: int) -> None:
        state = self.follower.states.get(partition)
        if state is None or partition not in self.ready_at or state.offset < self.ready_at[partition]:
            return
        if state.offset < self.inflight.get(partition, -1) or not state.pending:
            return
        idle = self.last_version.get(partition) == state.version
        now = time.time()
        if idle and not any(state.jobs[j].not_before > 0 for j in state.pending):
            return
        self.last_version[partition] = state.version
        with tracer.start_as_current_span("schedule-cycle") as span:
            decisions = self.scheduler.cycle(state, now)
            span.set_attribute("gpusched.partition", partition)
            span.set_attribute("gpusched.decisions", len(decisions))
        if not decisions:
            return
        events = [
            (ev.JobPlaced(event_id=uuid.uuid4().hex, time=now, producer=self.me, job_id=d.job_id,
                          attempt=d.attempt, workers=d.workers, policy=d.policy),
             state.jobs[d.job_id].spec.pool)
            for d in decisions
        ]
        self.inflight[partition] = math.inf
        positions = await self.publisher.publish_all(events)
        self.inflight[partition] = max(p.offset for p in positions)
        self.decisions += len(decisions)
