"""The placer's decision: one scheduling cycle per owned pool, as ``JobPlaced`` proposals,
then why the jobs it left pending wait, as ``JobPendingReason`` where that changed
(``reasons``, docs/guide/why-pending.md).

What keeps the cycles few and short in a burst (docs/design/benchmarks.md, scale_bench):

* An unchanged pool cycles again only once a waiting job's retry back-off ended since
  its last cycle (``_backoff_ended``).
* A pool whose state moved only by pending reasons (the placer's own writes; no policy
  reads them) is idle for scheduling: no new cycle, only the reasons pass it still owes.
  Otherwise each pass's writes would start another full cycle, and with thousands of
  jobs waiting on a full cluster the placer would cycle until every reason was written.
* After a cycle that placed jobs the reasons pass is skipped, unless the last pass is
  ``REASONS_EVERY_S`` old: it would run between the cycle and the append of its
  placements, with every placement booked first (as long as the cycle itself after a
  cycle of 2,500 placements). The jobs left waiting are looked at by the next pass.
* The cyclic GC is paused across the cycle and the pass: what they allocate dies by
  reference count when they end, and a collection in the middle would only rescan it.
* A pool taken (at the start, or from another placer) is warmed before its first cycle,
  off that cycle's clock (``_warm``): else the first cycle builds what the cycles keep
  for the next (the placement indexes from every node, the queues' keys) and costs
  several later ones.
"""
from __future__ import annotations

import copy
import dataclasses
import math
import os
import time
from dataclasses import dataclass, field

from gpusched.adapters.telemetry import metrics, tracing
from gpusched.adapters.log.gc_pacing import gc_paused
from gpusched.core import events as ev
from gpusched.core.state import ClusterState
from gpusched.policies.memory import CycleMemory
from gpusched.policies.queueing.parking import ParkedJobs
from gpusched.policies.scheduler import Scheduler
from gpusched_placer.cycle_log import CycleLog
from gpusched_placer.reasons import MIN_INTERVAL_S, PendingReasons

REASONS_EVERY_S = MIN_INTERVAL_S   # while cycles place jobs: a job's reason is not written more often anyway


@dataclass(slots=True)
class PoolMemory:
    """What the placer keeps for one partition between its cycles, dropped whole when the
    partition is gained or lost (its next state is another object)."""
    # What its cycles keep for the next (parked jobs, queue keys, indexes: ``policies.memory``).
    policies: CycleMemory = field(default_factory=CycleMemory)
    warmed: bool = False                 # whether a warming cycle built ``policies`` (``_warm``)
    last_version: int | None = None      # the scheduling version of its last cycle
    reason_bumps: int = 0                # pending reasons folded (each bumped the state's version)
    reasons_at: float = -math.inf        # when its last reasons pass ran
    cycled_at: float = -math.inf         # the ``now`` of its last cycle
    wake: tuple | None = None            # (state, version, first back-off end after its last cycle)


class PlacementDecider:
    def __init__(self, scheduler: Scheduler, me: str, cycle_log: CycleLog | None = None) -> None:
        self.scheduler = scheduler
        self.me = me
        self.cycle_log = cycle_log   # --cycle-log: a line per cycle (benchmarks)
        self._memory: dict[int, PoolMemory] = {}
        self.reasons = PendingReasons(me, default_estimate_s=scheduler.config.default_estimate_s)
        # The warming cycle: the scheduler with no cursor (a head as long as the budget), so
        # it leaves the round of cycles where it was; its bound on time is the cycle's.
        self._warming = copy.copy(scheduler)
        self._warming.config = dataclasses.replace(scheduler.config, job_test_head=scheduler.config.max_job_test)

    def forget(self, partitions: set[int]) -> None:
        """Partitions gained or lost: their next state is another object."""
        for p in partitions:
            self._memory.pop(p, None)
        self.reasons.forget(partitions)

    def memory(self, partition: int) -> PoolMemory:
        memory = self._memory.get(partition)
        if memory is None:
            memory = self._memory[partition] = PoolMemory()
        return memory

    def on_event(self, partition: int, offset: int, event: ev.Event, outcome, state: ClusterState) -> None:
        """The follower's hook: counts the pending reasons folded. An accepted event bumps
        the version by one, so the version less these moves only with what a cycle reads
        (a reason the hook missed moves it too: a cycle too many, never one too few)."""
        if outcome.accepted and type(event) is ev.JobPendingReason:
            self.memory(partition).reason_bumps += 1

    def scheduling_version(self, partition: int, state: ClusterState) -> int:
        memory = self._memory.get(partition)
        return state.version - (memory.reason_bumps if memory is not None else 0)

    def __call__(self, partition: int, state: ClusterState, now: float) -> list[tuple[ev.Event, str]]:
        if not state.pending:
            return []
        with gc_paused():
            return self._decide(partition, state, now)

    def _decide(self, partition: int, state: ClusterState, now: float) -> list[tuple[ev.Event, str]]:
        # Nothing a cycle reads changed since the last cycle and no retry back-off ended: skip.
        version = self.scheduling_version(partition, state)
        memory = self.memory(partition)
        if memory.last_version == version and not self._backoff_ended(memory, state, now, version):
            # The same state: only pending reasons the last pass could not reach or held back.
            if not self.reasons.due(partition, state, now):
                return []
            return [(e, state.jobs[e.job_id].spec.pool)
                    for e in self.reasons.idle_pass(partition, state, now, memory.policies)]
        memory.last_version, memory.cycled_at, memory.wake = version, now, None
        if not memory.warmed:
            self._warm(memory.policies, state, now)
            memory.warmed = True
        if self.cycle_log is not None:
            self.cycle_log.start()
        started = time.perf_counter()
        with tracing.tracer().start_as_current_span("schedule-cycle") as span:
            cycle = self.scheduler.schedule(state, now, memory.policies)
            decisions = cycle.decisions
            span.set_attribute("gpusched.partition", partition)
            span.set_attribute("gpusched.decisions", len(decisions))
        placed = [self._placed(d, state, now, span) for d in decisions]
        cycle_s = time.perf_counter() - started
        metrics.cycle_done(partition, cycle_s, placed)
        if self.cycle_log is not None:
            self.cycle_log.ended()
        why = []
        if not placed or now - memory.reasons_at >= REASONS_EVERY_S:
            memory.reasons_at = now
            # What the cycle found, and its placement indexes (closed, in step again at the pass), reused.
            why = self.reasons.after_cycle(partition, state, now, cycle, memory.policies)
        if self.cycle_log is not None:
            self.cycle_log.done(partition, cycle_s, len(state.pending), len(placed),
                                time.perf_counter() - started - cycle_s)
        return placed + [(e, state.jobs[e.job_id].spec.pool) for e in why]

    def _warm(self, memory: CycleMemory, state: ClusterState, now: float) -> None:
        """Build what cycles keep between them for a pool's first cycle, by a cycle whose
        decisions are dropped: the same jobs in the same order as the first cycle will
        take (no cursor), booked and rolled back; the jobs it parked are forgotten. What
        it keeps is brought in step at the next cycle's start like any cycle's
        (``kept_index``), so the first cycle decides as it would cold."""
        with tracing.tracer().start_as_current_span("warm-cycle"):
            self._warming.schedule(state, now, memory)
        memory.parked = ParkedJobs()

    def _backoff_ended(self, memory: PoolMemory, state: ClusterState, now: float, version: int) -> bool:
        """Whether a pending job's retry back-off ended since the last cycle: the only job
        that cycle could not offer and this one can. (Any back-off at all, even one ended
        long ago or hours away, used to start a cycle every round.) The first end after the
        last cycle is found by one scan of the queue per idle state, not every idle round
        (a scan of 50,000 jobs each): while the scheduling version stays, so do the queue
        and its back-offs (pending reasons change neither)."""
        known = memory.wake
        if known is None or known[0] is not state or known[1] != version:
            since, jobs = memory.cycled_at, state.jobs
            first = min((end for j in state.pending if (end := jobs[j].not_before) > since), default=math.inf)
            known = memory.wake = (state, version, first)
        return known[2] <= now

    def _placed(self, d, state: ClusterState, now: float, cycle) -> tuple[ev.Event, str]:
        """The decision as a ``JobPlaced``, with its span in the job's trace (linked to the cycle)."""
        pool = state.jobs[d.job_id].spec.pool
        attributes = {"gpusched.pool": pool, "gpusched.attempt": d.attempt, "gpusched.policy": d.policy}
        with tracing.job_span("place", d.job_id, attributes, link=cycle):
            # 32 random hex digits as uuid4().hex, without building a UUID: a sixth of its
            # CPU, paid for every placement inside the cycle's time.
            return (ev.JobPlaced(event_id=os.urandom(16).hex(), time=now, producer=self.me, job_id=d.job_id,
                                 attempt=d.attempt, workers=d.workers, policy=d.policy), pool)
