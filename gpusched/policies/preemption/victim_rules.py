"""Preemption's rules: who may be a victim, what victims cost, and one call's view
(``SearchContext``: borrowing, projected usage, victims already chosen), used by
preemption (``gpusched.policies.preemption.decisions``) and defragmentation
(``gpusched.policies.preemption.defrag``), which adds a rule of its own.

Who may be a victim of a pending job ``J`` for preemption (``SearchContext.eligible``):

* it holds GPUs and is running (RUNNING or PLACED, not already PREEMPTING) and is
  ``preemptible``;
* and either *priority*: its class is strictly lower than ``J``'s, it has run at least its
  *exempt time* (since it started, or since it was placed when it never started):
  ``min_runtime_s`` (or its pool's), doubled (``min_runtime_growth``) for each time it was
  already preempted, at most ``max_min_runtime_s``, and it was preempted fewer than
  ``preemption_budget`` times (``gpusched.policies.preemption.protection``); or *quota
  reclaim*: ``J``'s team still fits in its guarantee with ``J`` (used + J <= guaranteed),
  the victim is *borrowed* capacity of another team, of ``J``'s class or lower (never
  higher), and has run ``reclaim_min_runtime_s`` (reason ``reclaim``). A reclaim is not
  held up by the exempt time nor the budget: the guarantee is owed to the other team now,
  and the reclaim window (below) keeps a job from being reclaimed again and again.

``SearchContext.shield`` says which of these rules keeps a job from being a victim (a
``Shield``), None when none does.

A team's jobs above its guarantee count as borrowed: the team's running jobs are ranked
(priority class high to low, then oldest first), and a job whose cumulative GPU milli
crosses the guarantee is borrowed, as is every job after it.

Stability of reclaim (``SearchContext.reclaimable``): a reclaim victim lies *wholly* above
its team's guarantee (the job straddling the guarantee is borrowed for cost, but not
reclaimed: the team would fall below its guarantee, reclaim in turn, and the two teams
would take capacity back and forth); and a job preempted for reclaim (its latest
``JobPreempted`` reason says so) is not reclaimed again within ``reclaim_window_s``. The
price: a team's guarantee is met to within the size of another team's job that straddles
its own guarantee, until that job ends.

Either way, a preemption must pay for itself (``SearchContext.costly``,
``protection.wait_allowance``): no victim, and no set of victims together, loses more than
``max_loss_per_wait`` times the GPU-time ``J`` has waited since it last entered the queue.

Cost. *Work lost* is GPU-seconds: run time since the last checkpoint (since the start
without one) times the job's GPUs. Candidates are ranked one by one by ``(priority,
borrowed first, work lost, larger first, submission order)``, except reclaimed ones (of
``J``'s own class), ranked ``(priority, borrowed first, smaller first, work lost, ...)``; a
*set* of victims is ranked by ``(highest priority in it, non-borrowed milli at that
priority, milli reclaimed, total work lost, number of jobs)`` — lowest priority first, then
borrowed capacity first, then (for a reclaim) the least capacity taken, then the least
GPU-seconds lost, then fewest jobs. A reclaim thus frees no more than its beneficiary needs, as far as the
node-local search sees: capacity freed beyond it would be lent to a borrower again and
reclaimed back, the oscillation between teams that sharing must not show.

The search itself, shared with defragmentation's own rule, is
``gpusched.policies.preemption.victim_search``; preemption runs it on an index of candidate
victims kept between rounds (``victim_index``, ``indexed_search``): the same answer, a few
nodes read.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Mapping, Sequence

from gpusched.core.model import JobPhase, WorkerAssignment
from gpusched.core.priority import priority_value
from gpusched.core.state import ClusterState, JobState, NodeState
from gpusched.policies.placement.gang import Placement
from gpusched.policies.placement.registry import PLACEMENTS, make_placement
from gpusched.policies.queueing.quota import QueueTree, claims_guarantee
from gpusched.policies.statement import NodeView, Statement, tentative
from gpusched.policies.preemption.protection import (
    Shield, budget_spent, exempt_s, lost_gpu_s, reclaimed_within, running_since, wait_allowance)
from gpusched.policies.preemption.borrowing import TeamLedger
from gpusched.policies.preemption.indexed_search import IndexedSearch
from gpusched.policies.preemption.placer_views import PlacerViews
from gpusched.policies.preemption.slot_counts import ScratchChanges, SlotCounts
from gpusched.policies.preemption.victim_index import VictimIndex

REASON_PRIORITY = "priority"
REASON_RECLAIM = "reclaim"


@dataclass(frozen=True, slots=True)
class PreemptionConfig:
    # Exempt time (``protection``): an attempt runs at least min_runtime_s (its pool's, when
    # named) x min_runtime_growth per earlier preemption of the job, at most max_min_runtime_s,
    # before it may be a victim; 10 min, then 20, 40, bounded by an hour.
    min_runtime_s: float = 600.0
    min_runtime_growth: float = 2.0
    max_min_runtime_s: float = 3600.0
    pool_min_runtime_s: Mapping[str, float] = field(default_factory=dict)
    # A job preempted this often is not preempted for priority any more (reclaim still may);
    # 0: no budget.
    preemption_budget: int = 3
    # A reclaim takes borrowed capacity that ran this long, whatever the job's history: a
    # team's guarantee is not held up by the exempt time; the reclaim window keeps a job
    # from being reclaimed again and again.
    reclaim_min_runtime_s: float = 30.0
    # Victims per pending job: None (the default) is no cap. The search's work is bounded by
    # the job's worker count (``victim_search``), so a cap only limits disruption, and one
    # below what a large gang needs (32 one-GPU jobs for 4 x 8 GPUs) makes it wait forever.
    max_victims: int | None = None
    nomination_ttl_s: float = 120.0      # a nomination younger than this is still in flight
    quotas: QueueTree = field(default_factory=QueueTree)   # team guarantees (borrowing, reclaim)
    placement: str = "best-fit"          # the placement scoring the placer uses
    max_examined: int = 256              # pending jobs looked at per call, to bound its latency
    # Defragmentation (``gpusched.policies.preemption.defrag``).
    defrag_max_work_lost_s: float = 600.0   # work at risk of all jobs moved for one pending job
    defrag_max_moves: int = 4               # jobs moved for one pending job
    defrag_max_plans: int = 32              # candidate node plans tried per pending job
    # A job preempted for reclaim is not reclaimed again for this long (seconds): else two
    # teams borrowing from each other can take the same jobs back and forth.
    reclaim_window_s: float = 600.0
    # A preemption's victims lose at most this times the GPU-time its beneficiary waited
    # (``protection.wait_allowance``), for priority and reclaim alike.
    max_loss_per_wait: float = 0.02

    def __post_init__(self) -> None:
        if self.placement not in PLACEMENTS:
            raise ValueError(f"unknown placement policy {self.placement!r}; known: {sorted(PLACEMENTS)}")
        if not all(v >= 0 for v in (self.min_runtime_s, self.nomination_ttl_s, self.reclaim_window_s,
                                    self.reclaim_min_runtime_s, self.max_loss_per_wait)):
            raise ValueError("min_runtime_s, nomination_ttl_s, reclaim_window_s, reclaim_min_runtime_s and "
                             "max_loss_per_wait must be >= 0")
        if self.min_runtime_growth < 1 or self.max_min_runtime_s < 0 or self.preemption_budget < 0:
            raise ValueError("min_runtime_growth must be >= 1, max_min_runtime_s and preemption_budget >= 0")
        if any(not v >= 0 for v in self.pool_min_runtime_s.values()):
            raise ValueError(f"a pool's min runtime is seconds >= 0, not {dict(self.pool_min_runtime_s)}")
        if self.max_victims is not None and self.max_victims < 1:
            raise ValueError("max_victims must be >= 1 (or None: no cap)")

    def guaranteed_milli(self, team: str) -> float:
        return self.quotas.team_quota(team).guaranteed_milli

    def exempt_s(self, job: JobState) -> float:
        """How long ``job``'s attempt runs before it may be a victim."""
        base = self.pool_min_runtime_s.get(job.spec.pool, self.min_runtime_s)
        return exempt_s(job.preemptions, base, self.min_runtime_growth, self.max_min_runtime_s)

    def exempt_until(self, job: JobState) -> float:
        return running_since(job) + self.exempt_s(job)


@dataclass(slots=True)
class Found:
    victims: list[JobState]
    workers: tuple[WorkerAssignment, ...]    # where the job goes once they are gone
    reason: str


class SearchContext:
    """One call's view: eligibility, borrowing, projected usage and the victim search.
    ``victims``: the index of candidate victims kept from the caller's last call (brought
    in step on first use); None: one built for this call. ``kept``: the caller's dict of
    placer views kept between calls on this state (``placer_views``); None: built for it."""

    def __init__(self, state: ClusterState, now: float, config: PreemptionConfig,
                 victims: VictimIndex | None = None, kept: dict | None = None) -> None:
        self.state, self.now, self.config = state, now, config
        self.score: Placement = make_placement(config.placement)
        self.taken: set[str] = set()               # victims chosen earlier in this call
        self.via_reclaim: set[str] = set()         # victims eligible only as quota reclaim
        self.extra: dict[str, int] = {}            # team -> milli booked for beneficiaries
        self._ledger: TeamLedger | None = None     # teams' usage and borrowing, built on first use
        self._kept, self._index = victims, None    # candidate victims, in step on first use
        self.in_flight = self._in_flight()
        # The placer's views (free-capacity indexes), held for the whole call while a
        # scratch is watched (``tentative``), and between calls in ``kept`` if given.
        self._touched = ScratchChanges()
        self._placer = PlacerViews(state, self._touched, kept, self.score)

    @contextmanager
    def tentative(self) -> Iterator[Statement]:
        """The call's scratch statement (``statement.tentative``), watched: the placer's
        views are built once for the call and told of the nodes the scratch changes
        (bookings, released victims), rather than rebuilt from every node of the pool for
        each pending job ``place`` is asked about (``placer_views``). A kept index of
        victims is brought in step first: it must never take a tentative booking for the
        state's own."""
        if self._kept is not None:
            self.victim_index()
        try:
            with tentative(self.state) as scratch:
                scratch.views[ScratchChanges] = self._touched
                self._placer.open()
                try:
                    yield scratch
                finally:
                    self._placer.close()
        finally:   # the scratch undone: the index's kept slot counts count its nodes again
            if self._index is not None:
                self._index.count_again(self._touched.ever)
            self._touched.ever.clear()

    # --- what is already under way ------------------------------------------------------
    def _in_flight(self) -> set[str]:
        """Pending jobs with a live preemption: a young nomination or PREEMPTING victims."""
        live = {j for j, (_, at) in self.state.nominations.items()
                if self.now - at < self.config.nomination_ttl_s}
        if self._kept is not None:   # the kept index knows them: no scan of the pool
            return live | set(self.victim_index().preempting.values())
        for node in self.state.nodes.values():
            for jid in node.jobs:
                job = self.state.jobs[jid]
                if job.phase is JobPhase.PREEMPTING and job.nominated_by:
                    live.add(job.nominated_by)
        return live

    def pending_in_order(self) -> list[JobState]:
        jobs = [self.state.jobs[j] for j in self.state.pending]
        ready = [j for j in jobs if j.not_before <= self.now]
        return sorted(ready, key=lambda j: (-priority_value(j.spec.priority_class), j.seq))

    # --- quota accounting -----------------------------------------------------------------
    def victim_index(self) -> VictimIndex:
        """The candidate victims (and the teams' running jobs), in step with the call's state."""
        if self._index is None:
            self._index = (self._kept or VictimIndex()).refresh(self.state, self.now, self.config)
        return self._index

    def team_jobs(self) -> dict[str, list[JobState]]:
        """Each team's RUNNING or PLACED jobs: those already on their way out (preempted,
        stopping) are neither victims nor usage to reclaim, their GPUs about to be free."""
        return self.victim_index().team_jobs()

    def used(self, team: str) -> int:
        """GPU milli the team holds (not counting jobs being preempted), plus what this call
        booked for it and what its in-flight beneficiaries will take."""
        held = self.ledger().held(team)
        coming = sum(self.state.jobs[j].milli for j in self.in_flight
                     if j in self.state.jobs and self.state.jobs[j].team == team
                     and self.state.jobs[j].phase is JobPhase.PENDING)
        return held + coming + self.extra.get(team, 0)

    def ledger(self) -> TeamLedger:
        """Borrowing (above): a team's jobs ranked once (kept by the index), read through the
        victims taken and the beneficiaries booked since (``borrowing``)."""
        if self._ledger is None:
            self._ledger = TeamLedger(self.team_jobs(), self.config.guaranteed_milli, self.taken, self.extra,
                                      self.victim_index().rankings)
        return self._ledger

    def borrowed(self, job: JobState) -> bool:
        return self.ledger().borrowed(job)

    def reclaimable(self, victim: JobState) -> bool:
        return self.reclaim_shield(victim) is None

    def reclaim_shield(self, victim: JobState) -> Shield | None:
        """A reclaim never takes a team below its guarantee (a job straddling it stays: else
        the reclaimed team falls short, reclaims in turn, and the two teams flip), nor takes
        a job it reclaimed less than ``reclaim_window_s`` ago."""
        if not self.ledger().wholly_above(victim):
            return Shield.GUARANTEED
        return Shield.RECLAIM_WINDOW if self.reclaimed_recently(victim) else None

    def reclaimed_recently(self, victim: JobState) -> bool:
        return reclaimed_within(victim, self.now, self.config.reclaim_window_s)

    def may_reclaim(self, job: JobState) -> bool:
        return claims_guarantee(self.used(job.team), job.milli, self.config.guaranteed_milli(job.team))

    # --- eligibility and cost -------------------------------------------------------------
    def eligible(self, victim: JobState, job: JobState, reclaim: bool) -> bool:
        if victim.job_id == job.job_id or victim.job_id in self.taken:
            return False
        return self.shield(victim, job, reclaim) is None

    def shield(self, victim: JobState, job: JobState, reclaim: bool) -> Shield | None:
        """Which rule keeps ``victim`` from being preempted for ``job`` (``reclaim``: ``job``
        may reclaim its team's guarantee), None when it may be. Notes the victims eligible as
        reclaim only (a lower class past its budget) in ``via_reclaim``."""
        if not victim.spec.preemptible:
            return Shield.NOT_PREEMPTIBLE
        if victim.phase not in (JobPhase.RUNNING, JobPhase.PLACED):
            return Shield.NOT_RUNNING
        mine, theirs = priority_value(job.spec.priority_class), priority_value(victim.spec.priority_class)
        lower, across = theirs < mine, reclaim and victim.team != job.team
        if not lower and (theirs > mine or not across):
            return Shield.NOT_LOWER
        age = self.now - running_since(victim)
        exempt = age < self.config.exempt_s(victim)
        if lower and not exempt and not budget_spent(victim, self.config.preemption_budget):
            return Shield.COSTLY if self.costly(victim, job) else None
        # Past here only a reclaim may take it; for a lower class, the priority rule that
        # keeps it is the reason given.
        priority_reason = Shield.EXEMPT if exempt else Shield.BUDGET_SPENT
        if not across:
            return priority_reason
        held = Shield.EXEMPT if age < self.config.reclaim_min_runtime_s else self.reclaim_shield(victim)
        if held is not None:
            return priority_reason if lower else held
        if self.costly(victim, job):
            return Shield.COSTLY
        if lower:
            self.via_reclaim.add(victim.job_id)
        return None

    def allowance(self, job: JobState) -> float:
        """GPU-seconds of work a preemption for ``job`` may lose now."""
        return wait_allowance(job, self.now, self.config.max_loss_per_wait)

    def costly(self, victim: JobState, job: JobState) -> bool:
        """``victim`` alone would lose more than ``job``'s wait allows."""
        return lost_gpu_s(victim, self.now) > self.allowance(job)

    def cost(self, victim: JobState, mine: int | None = None) -> tuple:
        """A victim's rank; ``mine``: the beneficiary's priority. Reclaimed capacity (a
        victim of the beneficiary's own class) goes smallest first: what a reclaim frees
        beyond its need, a borrower takes again and the next reclaim takes back."""
        theirs = priority_value(victim.spec.priority_class)
        if theirs == mine:
            return (theirs, not self.borrowed(victim), victim.milli, lost_gpu_s(victim, self.now),
                    victim.seq, victim.job_id)
        return (theirs, not self.borrowed(victim), lost_gpu_s(victim, self.now), -victim.milli,
                victim.seq, victim.job_id)

    def set_key(self, victims: Sequence[JobState], mine: int | None = None) -> tuple:
        top = max(priority_value(v.spec.priority_class) for v in victims)
        at_top = [v for v in victims if priority_value(v.spec.priority_class) == top]
        guaranteed = sum(v.milli for v in at_top if not self.borrowed(v))
        reclaimed = sum(v.milli for v in at_top) if top == mine else 0
        lost = sum(lost_gpu_s(v, self.now) for v in victims)
        return (top, guaranteed, reclaimed, round(lost, 6), len(victims))

    # --- placement --------------------------------------------------------------------------
    def place(self, job: JobState) -> tuple[WorkerAssignment, ...] | None:
        """Where the placer would put ``job`` on the state as it is now (booked or not)."""
        return self._placer.place(job, self.score)

    def kept_view(self, key: object, build: Callable[[Mapping[str, NodeState]], NodeView]) -> NodeView | None:
        """A view of the nodes kept for the call beside the placer's (``PlacerViews.view``);
        None without a watched scratch."""
        return self._placer.view(key, build)

    def shape(self, job: JobState) -> tuple:
        spec = job.spec
        reclaim = self.may_reclaim(job)
        return (spec.pool, spec.workers, spec.resources, priority_value(spec.priority_class),
                job.team if reclaim else None)

    def find(self, job: JobState, scratch: Statement) -> Found | None:
        """The cheapest victims for ``job`` (empty when it fits as is), with the placement it
        gets once they are gone; the scratch is back at its mark on return."""
        placed = self.place(job)
        if placed is not None:
            return Found([], placed, REASON_PRIORITY)
        reclaim = self.may_reclaim(job)
        mine = priority_value(job.spec.priority_class)
        victims = self._search(job, scratch, reclaim, mine).run()
        if victims is None or sum(lost_gpu_s(v, self.now) for v in victims) > self.allowance(job):
            return None
        mark = scratch.checkpoint()
        try:
            for v in victims:
                scratch.release(v)
            placed = self.place(job)
        finally:
            scratch.rollback(mark)
        if placed is None:
            return None   # the slot count and the placer disagree (MIG corner): do nothing
        reclaimed = any(priority_value(v.spec.priority_class) >= mine or v.job_id in self.via_reclaim
                        for v in victims)
        reason = REASON_RECLAIM if reclaimed else REASON_PRIORITY
        return Found(victims, placed, reason)

    def _search(self, job: JobState, scratch: Statement, reclaim: bool, mine: int) -> IndexedSearch:
        """The victim search for ``job`` on the index of candidate victims (``indexed_search``)."""
        index, spec = self.victim_index(), job.spec
        shape = (SlotCounts, spec.pool, spec.resources, spec.workers)
        slots = self.kept_view(shape, lambda _: index.slot_counts(shape, self._touched.ever))
        most = index.most_freeable(spec.pool, mine, reclaim, self._touched.ever)
        if slots is None:   # no watched scratch: nothing would keep counts true, nor the bound
            slots, most = SlotCounts(self.state.nodes, spec.pool, spec.resources, spec.workers), None
        assert isinstance(slots, SlotCounts)
        return IndexedSearch(self.state, job, scratch, lambda v: self.eligible(v, job, reclaim),
                             lambda v: self.cost(v, mine), lambda vs: self.set_key(vs, mine),
                             self.config.max_victims, index.candidates(spec.pool, mine, job.team, reclaim),
                             slots.on, slots.total, index.spread, most)

    def take(self, job: JobState, found: Found, scratch: Statement) -> None:
        """Release the victims and book the job, tentatively, for the rest of this call:
        later searches of the call neither choose those victims again nor count their
        capacity twice."""
        for v in found.victims:
            scratch.release(v)
            self.taken.add(v.job_id)
        scratch.book(job, found.workers)
        self.extra[job.team] = self.extra.get(job.team, 0) + job.milli
