"""Parking jobs that cannot fit until capacity grows: Kueue's inadmissible workloads,
the Kubernetes scheduler's unschedulable queue.

A cycle offers every ready job in queue order. When the cluster is full nearly all of
them fail, and the next cycle, milliseconds later, offers them all again: a cost that
grows with the backlog (~1.5 µs a job, 10-20 ms for 8,000) paid for every batch of
events. But between two bumps of ``state.capacity_epoch`` capacity only shrinks
(placements take, nothing frees; see the reducer), and whether a job fits is monotone
in free capacity, so a job that did not fit still does not. It is parked: later cycles
at the same epoch offer only the jobs that joined the queue since, in their queue order.
Parked jobs would have booked nothing, so the decisions are the ones a full cycle makes.

A job may have failed only because jobs decided before it in the same cycle booked
the capacity. That holds later only if those decisions were applied as decided: a
proposal the reducer rejected, one that never reached the log, or another proposal for
the same job that won (a second replica during a rebalance, placing it elsewhere)
leaves that capacity free without moving the epoch. So the parked set also remembers
the decisions of the cycle that last added to it, and is dropped unless each of those
jobs holds exactly the GPUs decided by the next cycle (the placer's next cycle waits for
its proposals to come back through the log).

As Kubernetes moves unschedulable pods back to the active queue after a while even
without an event, a parked set is also dropped ``MAX_PARKED_S`` after it was started: if
a placement policy ever failed a job that fits (a search that is not exhaustive, say),
the job waits that long at most, not until capacity next grows. A full cycle every 10 s
costs a busy pool next to nothing.

Only where a failure depends on capacity alone: not with backfill (a reservation
decides what later jobs may use) nor while nominations hold nodes for preemption
beneficiaries (holds come and go without the epoch moving). A job the guarantee hold
refused is not parked either: the hold lapses, or the team it kept capacity for is
placed, without the epoch moving. There the cycle is full and
the parked set is emptied.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from gpusched.core.model import WorkerAssignment
from gpusched.core.state import ClusterState


MAX_PARKED_S = 10.0
Decided = tuple[int, tuple[WorkerAssignment, ...]]   # (attempt, workers)


@dataclass(slots=True)
class ParkedJobs:
    """Jobs of one pool state that did not fit at ``epoch``. The scheduler's caller keeps
    one per state it schedules (the placer: one per owned partition)."""

    epoch: int = -1
    jobs: set[str] = field(default_factory=set)
    decided: dict[str, Decided] = field(default_factory=dict)   # job id -> what was decided, see above
    since: float = 0.0   # when this set was started (the cycles' clock)

    def current(self, state: ClusterState, now: float) -> set[str]:
        """The jobs still known not to fit: none once the epoch has moved, a decision
        they may have yielded to was not applied, or the set is MAX_PARKED_S old."""
        if (self.epoch != state.capacity_epoch or not self._decisions_applied(state)
                or not self.since <= now < self.since + MAX_PARKED_S):
            self.clear()
            self.epoch, self.since = state.capacity_epoch, now
        return self.jobs

    def _decisions_applied(self, state: ClusterState) -> bool:
        jobs = state.jobs
        for job_id, (attempt, workers) in self.decided.items():
            job = jobs.get(job_id)
            if job is None or job.attempt != attempt or not job.phase.holds_gpus or job.workers != workers:
                return False
        return True

    def park(self, state: ClusterState, job_ids: Iterable[str], decided: dict[str, Decided]) -> None:
        """After a cycle that started from ``current`` (the state is as it found it: the
        cycle's bookings are undone): add the jobs it could not place; remember what it
        decided."""
        self.jobs.update(job_ids)
        self.decided = decided
        if len(self.jobs) > 2 * len(state.pending) + 64:   # ids that left the queue meanwhile
            self.jobs.intersection_update(state.pending)

    def clear(self) -> None:
        self.jobs.clear()
        self.decided = {}


def parking_applies(state: ClusterState, backfill: bool) -> bool:
    return not backfill and not state.nominations
