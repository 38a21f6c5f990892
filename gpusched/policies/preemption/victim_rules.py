"""Preemption's rules: who may be a victim, what victims cost, and one call's view
(``SearchContext``: borrowing, projected usage, victims already chosen), used by
preemption (``gpusched.policies.preemption.decisions``) and defragmentation
(``gpusched.policies.preemption.defrag``), which adds a rule of its own.

Who may be a victim of a pending job ``J`` for preemption (``SearchContext.eligible``):

* it holds GPUs and is running (RUNNING or PLACED, not already PREEMPTING), is
  ``preemptible`` and has run at least ``min_runtime_s`` (since it started, or since it was
  placed when it never started);
* and either its priority class is strictly lower than ``J``'s (reason ``priority``), or
  *quota reclaim*: ``J``'s team still fits in its guarantee with ``J``
  (used + J <= guaranteed) and the victim is *borrowed* capacity of another team, whose
  priority may then equal ``J``'s (reason ``reclaim``; never higher).

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

Cost. Candidates are ranked one by one by ``(priority, borrowed first, work at risk,
larger first, submission order)``, except reclaimed ones (of ``J``'s own class), ranked
``(priority, borrowed first, smaller first, work at risk, ...)``; a *set* of victims is ranked
by ``(highest priority in it, non-borrowed milli at that priority, milli reclaimed, total
work at risk, number of jobs)`` — lowest priority first, then borrowed capacity first, then
(for a reclaim) the least capacity taken, then least work lost since the last checkpoint,
then fewest jobs. A reclaim thus frees no more than its beneficiary needs, as far as the
node-local search sees: capacity freed beyond it would be lent to a borrower again and
reclaimed back, the oscillation between teams that sharing must not show.

The search itself, shared with defragmentation's own rule, is
``gpusched.policies.preemption.victim_search``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from gpusched.core.model import JobPhase, WorkerAssignment
from gpusched.core.priority import priority_value
from gpusched.core.state import ClusterState, JobState
from gpusched.policies.placement.gang import Placement, place_gang
from gpusched.policies.placement.registry import PLACEMENTS, make_placement
from gpusched.policies.queueing.quota import QueueTree, claims_guarantee
from gpusched.policies.statement import Statement, tentative
from gpusched.policies.preemption.victim_search import VictimSearch

REASON_PRIORITY = "priority"
REASON_RECLAIM = "reclaim"


@dataclass(frozen=True, slots=True)
class PreemptionConfig:
    min_runtime_s: float = 30.0          # a job runs at least this long before it may be a victim
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

    def __post_init__(self) -> None:
        if self.placement not in PLACEMENTS:
            raise ValueError(f"unknown placement policy {self.placement!r}; known: {sorted(PLACEMENTS)}")
        if self.min_runtime_s < 0 or self.nomination_ttl_s < 0 or self.reclaim_window_s < 0:
            raise ValueError("min_runtime_s, nomination_ttl_s and reclaim_window_s must be >= 0")
        if self.max_victims is not None and self.max_victims < 1:
            raise ValueError("max_victims must be >= 1 (or None: no cap)")

    def guaranteed_milli(self, team: str) -> float:
        return self.quotas.team_quota(team).guaranteed_milli


def running_since(job: JobState) -> float:
    return job.started_at or job.placed_at


@dataclass(slots=True)
class Found:
    victims: list[JobState]
    workers: tuple[WorkerAssignment, ...]    # where the job goes once they are gone
    reason: str


class SearchContext:
    """One call's view: eligibility, borrowing, projected usage and the victim search."""

    def __init__(self, state: ClusterState, now: float, config: PreemptionConfig) -> None:
        self.state, self.now, self.config = state, now, config
        self.score: Placement = make_placement(config.placement)
        self.taken: set[str] = set()               # victims chosen earlier in this call
        self.extra: dict[str, int] = {}            # team -> milli booked for beneficiaries
        self._team_jobs: dict[str, list[JobState]] | None = None
        self._borrowed: dict[str, tuple[set[str], set[str]]] = {}   # team -> (borrowed, wholly above)
        self.in_flight = self._in_flight()

    # --- what is already under way ------------------------------------------------------
    def _in_flight(self) -> set[str]:
        """Pending jobs with a live preemption: a young nomination or PREEMPTING victims."""
        live = {j for j, (_, at) in self.state.nominations.items()
                if self.now - at < self.config.nomination_ttl_s}
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
    def team_jobs(self) -> dict[str, list[JobState]]:
        if self._team_jobs is None:
            teams: dict[str, dict[str, JobState]] = {}
            for node in self.state.nodes.values():
                for jid in node.jobs:
                    job = self.state.jobs[jid]
                    # Jobs already on their way out (preempted, stopping) are neither
                    # victims nor usage to reclaim: their GPUs are about to be free.
                    if job.phase.holds_gpus and job.phase is not JobPhase.PREEMPTING \
                            and job.phase is not JobPhase.STOPPING:
                        teams.setdefault(job.team, {})[jid] = job
            self._team_jobs = {t: list(js.values()) for t, js in teams.items()}
        return self._team_jobs

    def used(self, team: str) -> int:
        """GPU milli the team holds (not counting jobs being preempted), plus what this call
        booked for it and what its in-flight beneficiaries will take."""
        held = sum(j.milli for j in self.team_jobs().get(team, ()) if j.job_id not in self.taken)
        coming = sum(self.state.jobs[j].milli for j in self.in_flight
                     if j in self.state.jobs and self.state.jobs[j].team == team
                     and self.state.jobs[j].phase is JobPhase.PENDING)
        return held + coming + self.extra.get(team, 0)

    def _ranked(self, team: str) -> tuple[set[str], set[str]]:
        """The team's jobs that are borrowed (their milli crosses the guarantee, or comes
        after it) and those wholly above the guarantee (the team keeps its guarantee
        without them, all of them together)."""
        sets = self._borrowed.get(team)
        if sets is None:
            guarantee = self.config.guaranteed_milli(team)
            mine = [j for j in self.team_jobs().get(team, ()) if j.job_id not in self.taken]
            mine.sort(key=lambda j: (-priority_value(j.spec.priority_class), running_since(j), j.seq))
            cumulative = self.extra.get(team, 0)   # beneficiaries booked here come first
            sets = (set(), set())
            for j in mine:
                if cumulative >= guarantee:
                    sets[1].add(j.job_id)
                cumulative += j.milli
                if cumulative > guarantee:
                    sets[0].add(j.job_id)
            self._borrowed[team] = sets
        return sets

    def borrowed(self, job: JobState) -> bool:
        return job.job_id in self._ranked(job.team)[0]

    def reclaimable(self, victim: JobState) -> bool:
        """A reclaim never takes a team below its guarantee (a job straddling it stays: else
        the reclaimed team falls short, reclaims in turn, and the two teams flip), nor takes
        a job it reclaimed less than ``reclaim_window_s`` ago."""
        if victim.job_id not in self._ranked(victim.team)[1]:
            return False
        recent = self.now - victim.preempted_at < self.config.reclaim_window_s
        return not (recent and victim.preempted_reason.startswith(REASON_RECLAIM + ":"))

    def may_reclaim(self, job: JobState) -> bool:
        return claims_guarantee(self.used(job.team), job.milli, self.config.guaranteed_milli(job.team))

    # --- eligibility and cost -------------------------------------------------------------
    def eligible(self, victim: JobState, job: JobState, reclaim: bool) -> bool:
        if victim.job_id == job.job_id or victim.job_id in self.taken:
            return False
        if victim.phase not in (JobPhase.RUNNING, JobPhase.PLACED) or not victim.spec.preemptible:
            return False
        if self.now - running_since(victim) < self.config.min_runtime_s:
            return False
        mine, theirs = priority_value(job.spec.priority_class), priority_value(victim.spec.priority_class)
        if theirs < mine:
            return True
        return reclaim and theirs == mine and victim.team != job.team and self.reclaimable(victim)

    def cost(self, victim: JobState, mine: int | None = None) -> tuple:
        """A victim's rank; ``mine``: the beneficiary's priority. Reclaimed capacity (a
        victim of the beneficiary's own class) goes smallest first: what a reclaim frees
        beyond its need, a borrower takes again and the next reclaim takes back."""
        theirs = priority_value(victim.spec.priority_class)
        if theirs == mine:
            return (theirs, not self.borrowed(victim), victim.milli, victim.work_at_risk(self.now),
                    victim.seq, victim.job_id)
        return (theirs, not self.borrowed(victim), victim.work_at_risk(self.now), -victim.milli,
                victim.seq, victim.job_id)

    def set_key(self, victims: Sequence[JobState], mine: int | None = None) -> tuple:
        top = max(priority_value(v.spec.priority_class) for v in victims)
        at_top = [v for v in victims if priority_value(v.spec.priority_class) == top]
        guaranteed = sum(v.milli for v in at_top if not self.borrowed(v))
        reclaimed = sum(v.milli for v in at_top) if top == mine else 0
        work = sum(v.work_at_risk(self.now) for v in victims)
        return (top, guaranteed, reclaimed, round(work, 6), len(victims))

    # --- placement --------------------------------------------------------------------------
    def place(self, job: JobState) -> tuple[WorkerAssignment, ...] | None:
        """Where the placer would put ``job`` on the state as it is now (booked or not)."""
        # The nodes shared (so tentative releases show), the usage table private (so its
        # own tentative bookings never touch the state's): all place_gang reads.
        view = ClusterState(nodes=self.state.nodes)
        with tentative(view) as statement:
            return place_gang(view, job, self.score, statement)

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
        search = VictimSearch(self.state, job, scratch, lambda v: self.eligible(v, job, reclaim),
                              lambda v: self.cost(v, mine), lambda vs: self.set_key(vs, mine),
                              self.config.max_victims)
        victims = search.run()
        if victims is None:
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
        reason = REASON_RECLAIM if any(priority_value(v.spec.priority_class) >= mine for v in victims) \
            else REASON_PRIORITY
        return Found(victims, placed, reason)

    def take(self, job: JobState, found: Found, scratch: Statement) -> None:
        """Release the victims and book the job, tentatively, for the rest of this call:
        later searches of the call neither choose those victims again nor count their
        capacity twice."""
        for v in found.victims:
            scratch.release(v)
            self.taken.add(v.job_id)
        scratch.book(job, found.workers)
        self.extra[job.team] = self.extra.get(job.team, 0) + job.milli
        self._borrowed.clear()
