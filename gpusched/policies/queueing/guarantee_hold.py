"""The guarantee hold: free capacity below a waiting team's guarantee is not lent.

A team below its guarantee whose waiting jobs do not fit in what is free right now (a
4-GPU job, 2 GPUs free) cannot use the GPUs that free up one by one. Lent to another
team's borrowing job, they are reclaimed for it as soon as enough are free, and the
preemptions go back and forth between the two teams while jobs keep ending. So, within
one cycle, a placement that *borrows* (``claims_guarantee`` says no: the job takes its
team above its guarantee) must leave free, in GPU milli over the state's nodes (the pools
of one log partition, where quotas are counted too, not one pool), what every
other team waiting below its guarantee keeps back: its unused guarantee, at most what
its waiting jobs ask (Kueue's lendingLimit of zero, for as long as the team waits).
Placements within a team's own guarantee are never held back.

The bound: a team keeps capacity back for at most ``hold_s`` after its usage last
changed (a job of its placed or ended: ``ClusterState.ledger[team].at``, settled by the
reducer at every change) or after its oldest waiting job entered the queue, whichever is
later. While the team's own jobs keep ending, each departure frees more below its
guarantee, and what it waits for normally fits within a few of them; a team whose usage
has not moved for ``hold_s`` waits for something the hold does not bring (a job its
guarantee cannot hold, a fragmented pool), so the GPUs are lent again and a reclaim may
take them back. So held GPUs idle at most ``hold_s`` past the team's last change, and no
more than its unused guarantee. The default, 20 minutes, is twice the reclaim window: in
the borrow/reclaim workload (``gpusched.sim.reclaim``, jobs of 30 min to 2 h) 10 minutes
still leaves flips once demand is steady, 20 minutes none, and longer only idles more
(docs/design/scheduling-fairness.md).
"""
from __future__ import annotations

from typing import Iterable

from gpusched.core.state import ClusterState, JobState
from gpusched.policies.queueing.quota import QueueTree, claims_guarantee, within_limits

DEFAULT_GUARANTEE_HOLD_S = 1200.0   # seconds; see the bound above


class GuaranteeHold:
    """One cycle's hold. ``waiting``: the cycle's ready jobs (those within their limits keep
    capacity back); ``placed`` is told of every decision so a team's jobs placed in this
    cycle stop keeping capacity back."""

    def __init__(self, state: ClusterState, tree: QueueTree, waiting: Iterable[JobState], now: float,
                 hold_s: float = DEFAULT_GUARANTEE_HOLD_S) -> None:
        self.state, self.tree = state, tree
        self.asks: dict[str, int] = {}     # team -> GPU milli its waiting jobs ask
        self.holding: set[str] = set()     # ids of those jobs
        since: dict[str, float] = {}       # team -> when its oldest waiting job entered the queue
        for job in waiting:
            team = job.team
            # A job its limits keep out would hold capacity for nothing, for as long as the bound.
            if job.milli and tree.team_quota(team).guaranteed_milli and within_limits(state, tree, job):
                self.asks[team] = self.asks.get(team, 0) + job.milli
                self.holding.add(job.job_id)
                since[team] = min(since.get(team, job.pending_since), job.pending_since)
        for team, waited_from in since.items():
            # Held since the team's usage last changed (the ledger is settled at every change),
            # or since it began to wait, whichever is later.
            ledger = state.ledger.get(team)
            if now - max(waited_from, ledger.at if ledger is not None else 0.0) >= hold_s:
                del self.asks[team]
        self._capacity: int | None = None
        # What is kept back per team and allocated in all, as of the last decision: asked for
        # every borrowing offer (thousands a cycle in a full pool), changed only by decisions.
        self._kept_by_team: dict[str, int] | None = None
        self._used_all = 0

    @property
    def active(self) -> bool:
        """Whether some team may keep capacity back (else ``allows`` is always true)."""
        return any(self._kept(team) for team in self.asks)

    def _used(self, team: str) -> int:
        usage = self.state.usage.get(team)
        return usage.gpu_milli if usage is not None else 0

    def _kept(self, team: str) -> int:
        unused = self.tree.team_quota(team).guaranteed_milli - self._used(team)
        return max(0, min(unused, self.asks.get(team, 0)))

    def allows(self, job: JobState) -> bool:
        """Whether placing ``job`` now leaves free what the waiting teams keep back."""
        if not self.borrows(job):
            return True
        if self._kept_by_team is None:
            self._kept_by_team = {t: k for t in self.asks if (k := self._kept(t))}
            self._used_all = sum(u.gpu_milli for u in self.state.usage.values())
        kept = sum(k for t, k in self._kept_by_team.items() if t != job.team)
        return not kept or self.capacity() - self._used_all - job.milli >= kept

    def borrows(self, job: JobState) -> bool:
        """Whether placing ``job`` now takes its team above its guarantee as a borrower."""
        team = job.team
        return not claims_guarantee(self._used(team), job.milli, self.tree.team_quota(team).guaranteed_milli)

    def placed(self, job: JobState) -> None:
        """``job`` was booked (the cycle's decision): usage moved."""
        self._kept_by_team = None
        if job.job_id in self.holding:
            self.holding.discard(job.job_id)
            if job.team in self.asks:
                self.asks[job.team] -= job.milli

    def capacity(self) -> int:
        if self._capacity is None:
            self._capacity = sum(1000 * sum(1 for g in n.gpus if g.healthy)
                                 for n in self.state.nodes.values() if n.schedulable)
        return self._capacity


def guarantee_hold(state: ClusterState, tree: QueueTree, waiting: Iterable[JobState], now: float,
                   hold_s: float = DEFAULT_GUARANTEE_HOLD_S) -> GuaranteeHold | None:
    """The cycle's hold, or None where no team can keep anything back (no guarantees, or
    every waiting team at or above its own). Without guarantees ``waiting`` is not read."""
    if hold_s <= 0 or not tree.has_guarantees:
        return None
    hold = GuaranteeHold(state, tree, waiting, now, hold_s)
    return hold if hold.active else None
