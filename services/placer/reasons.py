"""Pending reasons: after a cycle, why the jobs it left pending wait
(``gpusched.policies.placement.diagnosis``), appended to the pool log as
``JobPendingReason`` only when a job's reason changes (docs/guide/why-pending.md).

Four limits keep it cheap for a long queue and a busy pool:

* a pass looks at ``per_pass`` jobs at most: jobs never looked at first (queue order),
  then those whose last look is oldest; jobs of one shape cost one look;
* a pass asks about ``node_checks_per_pass`` nodes at most (each shape's answer is about
  its pool's nodes): a pass runs between the cycle and the append of its placements, and
  at 5,000 nodes a pass of 64 shapes that scanned every node took about half as long as
  the cycle; the jobs it did not reach come first in the next pass, and at least one
  shape is looked at a pass. A pass reads the nodes through a free-capacity index kept
  between passes (``Diagnosis``'s memory; the placer lends its cycle's), so it checks only the nodes with room for
  a worker's GPUs, but counts the budget in the pool's nodes, as a scan would;
* a job's reason is written at most once every ``min_interval_s``: a changed reason
  within that time is held back and written when the time is up;
* a partition writes at most ``rate_per_s`` reasons a second (a token bucket).

When the state does not change, the placer skips its cycle; ``due`` says a pass is still
owed then (jobs not looked at since the state last changed, reasons held back, requeued
jobs to look for), and ``idle_pass`` makes it against the same state, with the last
cycle's result (its verdicts, reservations and quotas: docs/guide/why-pending.md).
"""
from __future__ import annotations

import uuid
from itertools import chain
from dataclasses import dataclass, field

from gpusched.core import events as ev
from gpusched.core.model import PendingReason
from gpusched.core.state import ClusterState, JobState
from gpusched.policies.journal_cursor import JournalCursor
from gpusched.policies.memory import CycleMemory
from gpusched.policies.placement.diagnosis import Diagnosis
from gpusched.policies.reservation.backfill import DEFAULT_ESTIMATE_S
from gpusched.policies.scheduler import CycleResult

PER_PASS = 64
# In the pool's nodes a scan would check (about 20-30 ms of first_failing at ~0.6-0.9 us a
# node): 6 shapes a pass at 5,000 nodes, the whole PER_PASS up to 500. Through the kept index
# a shape checks only the nodes with room for a worker, so a pass costs far less than that.
NODE_CHECKS_PER_PASS = 32_768
MIN_INTERVAL_S = 5.0
RATE_PER_S = 50.0
FULL_CHECK_S = 1.0       # at most this often the whole queue is compared (for requeued jobs)
RESEND_AFTER_S = 30.0   # a reason written that never showed up in the log (a lost write) is written again


@dataclass
class _Partition:
    generation: int = 0      # bumps with every cycle: looks from earlier ones are stale
    # job -> generation of its last look, in the order of the looks (oldest first)
    looked: dict[str, int] = field(default_factory=dict)
    sent: dict[str, tuple[int, PendingReason, float]] = field(default_factory=dict)   # job -> (attempt, reason, when)
    held: dict[str, float] = field(default_factory=dict)   # job -> when its held-back reason may be written
    complete: bool = True    # the last pass reached every job
    unlooked: dict[str, None] = field(default_factory=dict)   # jobs never looked at, in queue order
    front: dict[str, None] = field(default_factory=dict)      # never looked at, deferred: before ``unlooked``
    seq_seen: int = 0        # jobs submitted before this were seen by ``_unlooked``
    epoch_checked: int = -1  # the capacity epoch of the last comparison of the whole queue
    checked_at: float = -FULL_CHECK_S
    journal: JournalCursor = field(default_factory=JournalCursor)   # the reducer's journal at the last comparison
    tokens: float = RATE_PER_S
    tokens_at: float = 0.0
    cycle: CycleResult | None = None   # the last cycle's result
    memory: CycleMemory = field(default_factory=CycleMemory)   # its placement indexes kept between passes (or the cycle's)


class PendingReasons:
    def __init__(self, producer: str, per_pass: int = PER_PASS, min_interval_s: float = MIN_INTERVAL_S,
                 rate_per_s: float = RATE_PER_S, default_estimate_s: float = DEFAULT_ESTIMATE_S,
                 node_checks_per_pass: int = NODE_CHECKS_PER_PASS, keep_indexes: bool = True) -> None:
        self.producer = producer
        self.keep_indexes = keep_indexes   # False: every node checked for every shape (the tests' reference)
        self.node_checks_per_pass = node_checks_per_pass
        self.default_estimate_s = default_estimate_s   # the scheduler's: who delays a reservation
        self.per_pass, self.min_interval_s, self.rate_per_s = per_pass, min_interval_s, rate_per_s
        self._parts: dict[int, _Partition] = {}

    def forget(self, partitions: set[int]) -> None:
        for p in partitions:
            self._parts.pop(p, None)

    def after_cycle(self, partition: int, state: ClusterState, now: float,
                    cycle: CycleResult, memory: CycleMemory) -> list[ev.JobPendingReason]:
        """The reasons to write after ``cycle`` (its decisions are not in the log yet).
        ``memory``: the cycle's, whose placement indexes are read instead of a copy kept
        here (see ``_share``)."""
        part = self._parts.setdefault(partition, _Partition(tokens=self.rate_per_s, tokens_at=now))
        self._share(part, memory)
        part.generation += 1
        part.cycle = cycle
        booked = [(state.jobs[d.job_id], d.workers) for d in cycle.decisions]
        return self._pass(part, state, now, booked)

    def due(self, partition: int, state: ClusterState, now: float) -> bool:
        """Whether a pass is owed although the state has not changed since the last cycle."""
        part = self._parts.get(partition)
        return part is not None and (not part.complete or any(t <= now for t in part.held.values())
                                     or self._full_check_due(part, state, now))

    def idle_pass(self, partition: int, state: ClusterState, now: float,
                  memory: CycleMemory) -> list[ev.JobPendingReason]:
        part = self._parts.get(partition)
        if part is None:
            return []
        self._share(part, memory)
        return self._pass(part, state, now, [])

    @staticmethod
    def _share(part: _Partition, memory: CycleMemory) -> None:
        """Read the cycle's kept placement indexes rather than keep a second copy: after a
        big placing cycle, bringing a copy of its own in step with the log was half of a
        pass, work the cycle had just done for its copy. Safe because the pass runs after
        the cycle's statement closed and before anything changes the state, and a
        ``Diagnosis`` refreshes the indexes before it reads them (``KeptIndexes.install``):
        the nodes that statement changed are looked at again, so the pass reads what a
        fresh build would be; its own tentative changes are likewise left for the next
        reader's refresh."""
        part.memory = memory

    def _pass(self, part: _Partition, state: ClusterState, now: float, booked: list) -> list[ev.JobPendingReason]:
        placed = {job.job_id for job, _ in booked}
        chosen = self._choose(part, state, placed, now)
        if not chosen:
            return []
        cycle, out = part.cycle, []
        with Diagnosis(state, now, part.memory, cycle.quotas, cycle, booked, self.default_estimate_s,
                       scan=not self.keep_indexes) as diagnosis:
            for i, job_id in enumerate(chosen):
                if i and diagnosis.node_checks >= self.node_checks_per_pass:
                    self._defer(part, chosen[i:])
                    break
                job = state.jobs[job_id]
                reason = diagnosis.diagnose(job)
                part.looked.pop(job_id, None)
                part.looked[job_id] = part.generation
                event = self._event(part, job, reason, now)
                if event is not None:
                    out.append(event)
        return out

    @staticmethod
    def _defer(part: _Partition, rest: list[str]) -> None:
        """Jobs a pass chose but its node budget did not reach. Held-back ones stay held and
        stale looks stay in ``looked``; those never looked at go back to the front of
        ``unlooked`` (in ``front``), in their order."""
        part.complete = False
        fresh = [j for j in rest if j not in part.looked and j not in part.held]
        if fresh:
            part.front = dict.fromkeys(fresh) | part.front   # a few jobs: ``unlooked`` is not copied

    def _choose(self, part: _Partition, state: ClusterState, placed: set[str], now: float) -> list[str]:
        """Held-back reasons that are due, jobs never looked at, then stale looks, oldest first."""
        pending, looked, budget = state.pending, part.looked, self.per_pass
        for job_id in [j for j in part.held if j not in pending or j in placed]:
            del part.held[job_id]
        chosen = [j for j, t in part.held.items() if t <= now][:budget]
        unlooked, front = self._unlooked(part, state, now), part.front
        taken = []
        for job_id in chain(front, unlooked):
            if len(chosen) >= budget:
                break
            taken.append(job_id)
            if job_id in pending and job_id not in looked and job_id not in placed:
                chosen.append(job_id)
        for job_id in taken:
            if job_id not in placed:
                del (front if job_id in front else unlooked)[job_id]
        if len(chosen) >= budget:
            part.complete = False
            return chosen
        gone = []
        part.complete = True
        for job_id, generation in looked.items():   # in look order, so in generation order
            if generation >= part.generation:
                break
            if job_id not in pending:
                gone.append(job_id)
            elif job_id not in placed and job_id not in part.held:
                if len(chosen) >= budget:
                    part.complete = False
                    break
                chosen.append(job_id)
        for job_id in gone:
            del looked[job_id]
            part.sent.pop(job_id, None)
        return chosen

    def _unlooked(self, part: _Partition, state: ClusterState, now: float) -> dict[str, None]:
        """Pending jobs never looked at, in queue order (those a pass deferred, ``front``,
        come before ``unlooked``). New submissions are found from the end of
        ``state.jobs`` (jobs join it in submission order) back to the last one seen,
        without a pass over the queue. Requeued jobs come back to the queue with a new
        attempt; each requeue releases capacity (``capacity_epoch``), so once the epoch
        moved the queue is compared again, at most every ``FULL_CHECK_S``."""
        jobs, unlooked, front = state.jobs, part.unlooked, part.front
        new = []
        for job_id in reversed(jobs):
            if jobs[job_id].seq < part.seq_seen:
                break
            new.append(job_id)
        part.seq_seen = state.next_seq
        if self._full_check_due(part, state, now):
            missing = [j for j in self._changed(part, state, new) if j not in unlooked and j not in front]
            for job_id in sorted(missing, key=lambda j: jobs[j].seq):
                unlooked[job_id] = None
            part.epoch_checked, part.checked_at = state.capacity_epoch, now
        else:
            for job_id in reversed(new):
                if job_id not in part.looked and job_id not in front:
                    unlooked[job_id] = None
        return unlooked

    @staticmethod
    def _changed(part: _Partition, state: ClusterState, new: list[str]) -> set[str]:
        """Pending jobs not looked at: among the jobs the reducer journalled since the last
        comparison, and ``new``. A job leaves ``looked`` and ``unlooked`` only when it is
        not pending, and comes back to the queue only with an event that journals it, so
        these are all of them; the whole queue is compared where the journal cannot say
        (the first comparison, another state, entries dropped)."""
        since = part.journal.read(state)
        pending, looked = state.pending, part.looked
        if since is None:
            return pending.keys() - looked.keys()
        return {j for j in (*since, *new) if j in pending and j not in looked}

    def _full_check_due(self, part: _Partition, state: ClusterState, now: float) -> bool:
        return part.epoch_checked != state.capacity_epoch and now - part.checked_at >= FULL_CHECK_S

    def _event(self, part: _Partition, job: JobState, reason: PendingReason, now: float) -> ev.JobPendingReason | None:
        """The event that writes ``reason``, or None: the log has it, it is on its way, or a
        limit holds it back (then ``held`` says when to try again)."""
        part.held.pop(job.job_id, None)
        if job.pending_reason == reason:
            return None
        last = part.sent.get(job.job_id)
        if last is not None and last[0] == job.attempt:
            if last[1] == reason and now - last[2] < RESEND_AFTER_S:
                return None
            if now - last[2] < self.min_interval_s:
                part.held[job.job_id] = last[2] + self.min_interval_s
                return None
        if not self._take_token(part, now):
            part.held[job.job_id] = now + 1.0 / self.rate_per_s
            return None
        part.sent[job.job_id] = (job.attempt, reason, now)
        return ev.JobPendingReason(event_id=uuid.uuid4().hex, time=now, producer=self.producer, job_id=job.job_id,
                                   attempt=job.attempt, reason=reason)

    def _take_token(self, part: _Partition, now: float) -> bool:
        part.tokens = min(self.rate_per_s, part.tokens + (now - part.tokens_at) * self.rate_per_s)
        part.tokens_at = now
        if part.tokens < 1.0:
            return False
        part.tokens -= 1.0
        return True
