"""The placer's decision: one scheduling cycle per owned pool, as ``JobPlaced`` proposals,
then why the jobs it left pending wait, as ``JobPendingReason`` where that changed
(``reasons``, docs/why-pending.md)."""
from __future__ import annotations

import time
import uuid

from gpusched.adapters import metrics, tracing
from gpusched.core import events as ev
from gpusched.core.state import ClusterState
from gpusched.policies.queueing.parking import ParkedJobs
from gpusched.policies.queueing.keys import QueueKeys
from gpusched.policies.scheduler import Scheduler
from gpusched_placer.reasons import PendingReasons


class PlacementDecider:
    def __init__(self, scheduler: Scheduler, me: str) -> None:
        self.scheduler = scheduler
        self.me = me
        self._last_version: dict[int, int] = {}
        self._parked: dict[int, ParkedJobs] = {}   # partition -> jobs known not to fit
        self._keys: dict[int, QueueKeys] = {}      # partition -> its waiting jobs' keys and shapes
        self.reasons = PendingReasons(me, default_estimate_s=scheduler.config.default_estimate_s)

    def forget(self, partitions: set[int]) -> None:
        """Partitions gained or lost: their next state is another object."""
        for p in partitions:
            self._parked.pop(p, None)
            self._keys.pop(p, None)
            self._last_version.pop(p, None)
        self.reasons.forget(partitions)

    def __call__(self, partition: int, state: ClusterState, now: float) -> list[tuple[ev.Event, str]]:
        if not state.pending:
            return []
        # Nothing changed since the last cycle and no retry back-off is expiring: skip.
        idle = self._last_version.get(partition) == state.version
        if idle and not any(state.jobs[j].not_before > 0 for j in state.pending):
            # The same state: only pending reasons the last pass could not reach or held back.
            if not self.reasons.due(partition, state, now):
                return []
            return [(e, state.jobs[e.job_id].spec.pool) for e in self.reasons.idle_pass(partition, state, now)]
        self._last_version[partition] = state.version
        started = time.perf_counter()
        with tracing.tracer().start_as_current_span("schedule-cycle") as span:
            cycle = self.scheduler.schedule(state, now, self._parked.setdefault(partition, ParkedJobs()),
                                            self._keys.setdefault(partition, QueueKeys()))
            decisions = cycle.decisions
            span.set_attribute("gpusched.partition", partition)
            span.set_attribute("gpusched.decisions", len(decisions))
        placed = [self._placed(d, state, now, span) for d in decisions]
        metrics.cycle_done(partition, time.perf_counter() - started, placed)
        why = self.reasons.after_cycle(partition, state, now, cycle)   # what the cycle found, reused
        return placed + [(e, state.jobs[e.job_id].spec.pool) for e in why]

    def _placed(self, d, state: ClusterState, now: float, cycle) -> tuple[ev.Event, str]:
        """The decision as a ``JobPlaced``, with its span in the job's trace (linked to the cycle)."""
        pool = state.jobs[d.job_id].spec.pool
        attributes = {"gpusched.pool": pool, "gpusched.attempt": d.attempt, "gpusched.policy": d.policy}
        with tracing.job_span("place", d.job_id, attributes, link=cycle):
            return (ev.JobPlaced(event_id=uuid.uuid4().hex, time=now, producer=self.me, job_id=d.job_id,
                                 attempt=d.attempt, workers=d.workers, policy=d.policy), pool)
