"""Preemption's rule: who may be a victim and what victims cost, in which order, used by
preemption (``gpusched.policies.preemption.decisions``, through one call's view:
``search_context.SearchContext``) and defragmentation (``gpusched.policies.preemption.defrag``),
whose rule of moves is here too.

Who may be a victim of a pending job ``J`` for preemption (``shield``):

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

``shield`` says which of these rules keeps a job from being a victim (a ``Shield``), None
when none does.

A team's jobs above its guarantee count as borrowed: the team's running jobs are ranked
(``borrowing_order``: priority class high to low, then oldest first), and a job whose
cumulative GPU milli crosses the guarantee is borrowed (``crosses_guarantee``), as is
every job after it.

Stability of reclaim (``reclaim_shield``): a reclaim victim lies *wholly* above
its team's guarantee (``above_guarantee``; the job straddling the guarantee is borrowed for cost, but not
reclaimed: the team would fall below its guarantee, reclaim in turn, and the two teams
would take capacity back and forth); and a job preempted for reclaim (its latest
``JobPreempted`` reason says so) is not reclaimed again within ``reclaim_window_s``. The
price: a team's guarantee is met to within the size of another team's job that straddles
its own guarantee, until that job ends.

Either way, a preemption must pay for itself (``costly``, ``set_costly``,
``protection.wait_allowance``): no victim, and no set of victims together, loses more than
``max_loss_per_wait`` times the GPU-time ``J`` has waited since it last entered the queue.

Cost (``cost``, ``set_key``). *Work lost* is GPU-seconds: run time since the last checkpoint (since the start
without one) times the job's GPUs. Candidates are ranked one by one by ``(priority,
borrowed first, work lost, larger first, submission order)``, except reclaimed ones (of
``J``'s own class), ranked ``(priority, borrowed first, smaller first, work lost, ...)``; a
*set* of victims is ranked by ``(highest priority in it, non-borrowed milli at that
priority, milli reclaimed, total work lost, number of jobs)`` — lowest priority first, then
borrowed capacity first, then (for a reclaim) the least capacity taken, then the least
GPU-seconds lost, then fewest jobs. A reclaim thus frees no more than its beneficiary needs, as far as the
node-local search sees: capacity freed beyond it would be lent to a borrower again and
reclaimed back, the oscillation between teams that sharing must not show.

Defragmentation's rule (``defrag``), here too as its searches share the index's
machinery: a job may be *moved* (``may_move``) for a pending job ``J`` when it is running or placed,
preemptible and checkpointable, of ``J``'s class or lower, has run its exempt time and has
at most ``defrag_max_work_lost_s`` of work at risk; moves are ranked one by one by ``(work
at risk, larger last, priority, submission order)``, a set by ``(total work at risk, jobs
moved, GPU milli moved)``; a plan moves at most ``defrag_max_moves`` jobs, which lose at
most ``defrag_max_work_lost_s`` together (``moves_within_caps``).

This module is the rule, and only the rule: the functions below decide, and every
accelerator of the search calls them rather than restating them (``SearchContext`` asks
them per question, ``search_context``; the index of candidate victims lists a job by the
clock half of the rule, ``victim_listing``, and orders its lists by ``set_key_bound``,
``victim_index``; the teams' rankings follow ``borrowing_order``, ``borrowing``; the
round's gate asks ``may_be_victim`` and the class rules, ``gate``; defragmentation's kept
jobs ``may_ever_move`` and ``movable_from``, ``kept_movable``). A rule that only keeps
more jobs from being victims goes in ``shield`` (or ``may_move``) alone: the accelerators
list a superset of the victims and ask ``shield`` of each. docs/design/extending.md, "A
preemption rule", has the recipe.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Mapping, Protocol, Sequence

from gpusched.core.model import JobPhase
from gpusched.core.priority import priority_value
from gpusched.core.state import JobState
from gpusched.policies.placement.registry import PLACEMENTS
from gpusched.policies.queueing.quota import QueueTree
from gpusched.policies.preemption.protection import (
    Shield, budget_spent, exempt_s, lost_gpu_s, reclaimed_within, running_since, wait_allowance)

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



class Borrowing(Protocol):
    """What the rule asks of the teams' borrowing in one call (``SearchContext``, which
    reads it from ``borrowing.TeamLedger``): see the module doc."""

    def borrowed(self, job: JobState) -> bool: ...

    def wholly_above(self, job: JobState) -> bool: ...


# --- who may be a victim --------------------------------------------------------------------
HOLDING = (JobPhase.RUNNING, JobPhase.PLACED)   # the phases of a job that may be a victim


def may_be_victim(job: JobState) -> bool:
    """A victim of some pending job at some clock: preemptible, running or placed (not
    already being preempted nor stopping). ``shield``'s first two checks."""
    return job.spec.preemptible and job.phase in HOLDING


def lower_class(theirs: int, mine: int) -> bool:
    """Priority: a victim's class (``theirs``) is strictly below its pending job's."""
    return theirs < mine


def reclaimable_class(theirs: int, mine: int) -> bool:
    """Reclaim: a victim of another team is of its pending job's class or lower, never higher."""
    return theirs <= mine


def past_exempt(job: JobState, config: PreemptionConfig, now: float) -> bool:
    """``job``'s attempt has run its exempt time (``PreemptionConfig.exempt_s``)."""
    return now - running_since(job) >= config.exempt_s(job)


def within_budget(job: JobState, config: PreemptionConfig) -> bool:
    return not budget_spent(job, config.preemption_budget)


def past_reclaim_min(job: JobState, config: PreemptionConfig, now: float) -> bool:
    """``job``'s attempt has run ``reclaim_min_runtime_s``."""
    return now - running_since(job) >= config.reclaim_min_runtime_s


def reclaim_min_until(job: JobState, config: PreemptionConfig) -> float:
    """When ``past_reclaim_min`` begins to hold."""
    return running_since(job) + config.reclaim_min_runtime_s


def reclaimed_recently(job: JobState, config: PreemptionConfig, now: float) -> bool:
    """``job`` was reclaimed less than ``reclaim_window_s`` ago."""
    return bool(job.preempted_reason) and reclaimed_within(job, now, config.reclaim_window_s)


def reclaim_ready(job: JobState, config: PreemptionConfig, now: float) -> bool:
    """The clock and history let ``job`` be reclaimed: past ``reclaim_min_runtime_s`` and
    not reclaimed recently."""
    return past_reclaim_min(job, config, now) and not reclaimed_recently(job, config, now)


def victim_listing(job: JobState, config: PreemptionConfig, now: float) -> tuple[list[bool], float, float]:
    """The half of the rule that reads ``job``'s clock and history alone, for a job that
    ``may_be_victim``: whether at ``now`` it may be a victim [for priority (past its exempt
    time, within its budget), for reclaim (``reclaim_ready``)], and when each will hold
    (inf: never, or it holds already). What the index of candidate victims lists a job by
    (``victim_index``); ``shield`` decides the rest per question."""
    spent = not within_budget(job, config)
    by_priority = not spent and past_exempt(job, config, now)
    recent = reclaimed_recently(job, config, now)
    by_reclaim = not recent and past_reclaim_min(job, config, now)
    priority_due = math.inf if spent or by_priority else config.exempt_until(job)
    reclaim_due = math.inf if by_reclaim else max(
        reclaim_min_until(job, config), job.preempted_at + config.reclaim_window_s if recent else -math.inf)
    return [by_priority, by_reclaim], priority_due, reclaim_due


def listing_rules(config: PreemptionConfig) -> tuple:
    """What in a ``PreemptionConfig`` decides ``victim_listing``: an index listed under
    other values lists afresh."""
    return (config.min_runtime_s, config.min_runtime_growth, config.max_min_runtime_s,
            tuple(sorted(config.pool_min_runtime_s.items())), config.preemption_budget,
            config.reclaim_min_runtime_s, config.reclaim_window_s)


def costly(victim: JobState, job: JobState, now: float, config: PreemptionConfig) -> bool:
    """``victim`` alone would lose more than ``job``'s wait allows."""
    return lost_gpu_s(victim, now) > wait_allowance(job, now, config.max_loss_per_wait)


def set_costly(victims: Sequence[JobState], job: JobState, now: float, config: PreemptionConfig) -> bool:
    """``victims`` together would lose more than ``job``'s wait allows."""
    return sum(lost_gpu_s(v, now) for v in victims) > wait_allowance(job, now, config.max_loss_per_wait)


def reclaim_shield(victim: JobState, now: float, config: PreemptionConfig, teams: Borrowing) -> Shield | None:
    """A reclaim never takes a team below its guarantee (a job straddling it stays: else
    the reclaimed team falls short, reclaims in turn, and the two teams flip), nor takes
    a job it reclaimed less than ``reclaim_window_s`` ago."""
    if not teams.wholly_above(victim):
        return Shield.GUARANTEED
    return Shield.RECLAIM_WINDOW if reclaimed_recently(victim, config, now) else None


def shield(victim: JobState, job: JobState, reclaim: bool, now: float, config: PreemptionConfig,
           teams: Borrowing) -> tuple[Shield | None, bool]:
    """Which rule keeps ``victim`` from being preempted for ``job`` at ``now`` (``reclaim``:
    ``job`` may reclaim its team's guarantee), None when none does; and whether it is a
    victim as reclaim only (a lower class past its budget or exempt time)."""
    if not victim.spec.preemptible:
        return Shield.NOT_PREEMPTIBLE, False
    if victim.phase not in HOLDING:
        return Shield.NOT_RUNNING, False
    mine, theirs = priority_value(job.spec.priority_class), priority_value(victim.spec.priority_class)
    lower, across = lower_class(theirs, mine), reclaim and victim.team != job.team
    if not lower and not (across and reclaimable_class(theirs, mine)):
        return Shield.NOT_LOWER, False
    exempt = not past_exempt(victim, config, now)
    if lower and not exempt and within_budget(victim, config):
        return (Shield.COSTLY if costly(victim, job, now, config) else None), False
    # Past here only a reclaim may take it; for a lower class, the priority rule that
    # keeps it is the reason given.
    priority_reason = Shield.EXEMPT if exempt else Shield.BUDGET_SPENT
    if not across:
        return priority_reason, False
    held = Shield.EXEMPT if not past_reclaim_min(victim, config, now) else reclaim_shield(victim, now, config, teams)
    if held is not None:
        return (priority_reason if lower else held), False
    if costly(victim, job, now, config):
        return Shield.COSTLY, False
    return None, lower


def shield_ends(victim: JobState, job: JobState, config: PreemptionConfig) -> float:
    """When the exempt time that shields ``victim`` from ``job`` ends (``Shield.EXEMPT``):
    its exempt time for a lower class, else ``reclaim_min_runtime_s``."""
    lower = lower_class(priority_value(victim.spec.priority_class), priority_value(job.spec.priority_class))
    return config.exempt_until(victim) if lower else reclaim_min_until(victim, config)


def reason(victims: Sequence[JobState], mine: int, via_reclaim: set[str]) -> str:
    """A preemption's reason: reclaim when a victim is of the beneficiary's class (``mine``)
    or higher, or was eligible as reclaim only (``via_reclaim``)."""
    reclaimed = any(priority_value(v.spec.priority_class) >= mine or v.job_id in via_reclaim for v in victims)
    return REASON_RECLAIM if reclaimed else REASON_PRIORITY


# --- what victims cost, and in which order -------------------------------------------------
def work_began(job: JobState) -> float:
    """When the work a preemption of ``job`` would lose began (its last checkpoint, or its
    start; inf: never started, nothing to lose): of two jobs alike, the one whose work
    began later loses less at any clock (``lost_gpu_s``)."""
    return max(job.started_at, job.checkpoint_at) if job.started_at else math.inf


def cost(victim: JobState, mine: int | None, now: float, borrowed: bool) -> tuple:
    """A victim's rank; ``mine``: the beneficiary's priority, ``borrowed``: the victim's
    capacity is borrowed. Reclaimed capacity (a victim of the beneficiary's own class)
    goes smallest first: what a reclaim frees beyond its need, a borrower takes again and
    the next reclaim takes back."""
    theirs = priority_value(victim.spec.priority_class)
    if theirs == mine:
        return (theirs, not borrowed, victim.milli, lost_gpu_s(victim, now), victim.seq, victim.job_id)
    return (theirs, not borrowed, lost_gpu_s(victim, now), -victim.milli, victim.seq, victim.job_id)


def set_key(victims: Sequence[JobState], mine: int | None, now: float,
            borrowed: Callable[[JobState], bool]) -> tuple:
    """A set of victims' rank (see the module doc)."""
    top = max(priority_value(v.spec.priority_class) for v in victims)
    at_top = [v for v in victims if priority_value(v.spec.priority_class) == top]
    guaranteed = sum(v.milli for v in at_top if not borrowed(v))
    reclaimed = sum(v.milli for v in at_top) if top == mine else 0
    lost = sum(lost_gpu_s(v, now) for v in victims)
    return (top, guaranteed, reclaimed, round(lost, 6), len(victims))


def set_key_bound(job: JobState, now: float) -> tuple:
    """A lower bound of ``set_key`` for any set whose highest class is ``job``'s and which
    holds ``job``: that class; non-borrowed and reclaimed milli at least 0; work lost at
    least ``job``'s own (every job's is >= 0); at least one job."""
    return (priority_value(job.spec.priority_class), 0, 0, round(lost_gpu_s(job, now), 6), 1)


def borrowing_order(job: JobState) -> tuple:
    """The order in which a team's running jobs fill its guarantee: priority class high to
    low, then oldest first, then submission order."""
    return (-priority_value(job.spec.priority_class), running_since(job), job.seq)


def crosses_guarantee(before: int, milli: int, guarantee: float) -> bool:
    """A job with ``before`` milli of its team ranked before it is borrowed."""
    return before + milli > guarantee


def above_guarantee(before: int, guarantee: float) -> bool:
    """A job with ``before`` milli of its team ranked before it lies wholly above the
    guarantee: the team keeps its guarantee without it."""
    return guarantee <= 0 or before >= guarantee


# --- defragmentation's moves ----------------------------------------------------------------
def may_ever_move(job: JobState) -> bool:
    """Defragmentation may move ``job`` at some clock: running or placed, preemptible and
    checkpointable."""
    spec = job.spec
    return job.phase in HOLDING and spec.preemptible and spec.checkpoint_interval_s > 0


def movable_from(job: JobState, config: PreemptionConfig) -> float:
    """When ``job``'s exempt time ends, from which on it may be moved."""
    return config.exempt_until(job)


def move_risk_ok(job: JobState, now: float, config: PreemptionConfig) -> bool:
    """``job``'s work at risk is within what one pending job's moves may lose."""
    return not job.work_at_risk(now) > config.defrag_max_work_lost_s


def may_move_now(job: JobState, now: float, config: PreemptionConfig) -> bool:
    """``job`` may be moved at ``now`` for a pending job of any class it is not above."""
    return may_ever_move(job) and move_risk_ok(job, now, config) and now >= movable_from(job, config)


def moves_within_caps(moved: Sequence[JobState], now: float, config: PreemptionConfig) -> bool:
    """A plan moves at most ``defrag_max_moves`` jobs, which lose at most
    ``defrag_max_work_lost_s`` of work at risk together."""
    return len(moved) <= config.defrag_max_moves and \
        not sum(v.work_at_risk(now) for v in moved) > config.defrag_max_work_lost_s


def movable_class(theirs: int, mine: int) -> bool:
    """A moved job is of its pending job's class or lower."""
    return theirs <= mine


def may_move(victim: JobState, job: JobState, now: float, config: PreemptionConfig) -> bool:
    """``victim`` may be moved for ``job`` at ``now``."""
    return may_move_now(victim, now, config) and \
        movable_class(priority_value(victim.spec.priority_class), priority_value(job.spec.priority_class))


def move_cost(victim: JobState, now: float) -> tuple:
    return (victim.work_at_risk(now), victim.milli, priority_value(victim.spec.priority_class), victim.seq,
            victim.job_id)


def move_set_key(victims: Sequence[JobState], now: float) -> tuple:
    return (round(sum(v.work_at_risk(now) for v in victims), 6), len(victims), sum(v.milli for v in victims))


def move_bound(job: JobState, now: float) -> tuple:
    """A lower bound of ``move_set_key`` for any set holding ``job``: its own work at
    risk, rounded as the sum is."""
    return (round(job.work_at_risk(now), 6),)
