"""What protects a running job from preemption, and what a preemption costs it.

Jobs that do not checkpoint lose every second of their attempt when preempted, so a
preemptor that stops whatever is cheapest *now* thrashes: a job restarts, runs a little,
is stopped again, and its work is lost each time. Three rules bound that, as Slurm's
``PreemptExemptTime`` and KAI's min-runtime do:

* **Exempt time** (``exempt_s``): a job is not preempted for priority before its attempt
  has run ``min_runtime_s`` (its pool's value when ``pool_min_runtime_s`` names the pool),
  times ``min_runtime_growth`` for every time the job was already preempted, at most
  ``max_min_runtime_s``. It is bounded, so a job that needs victims waits at most that
  long for one to become eligible.
* **Budget** (``preemption_budget``): a job preempted that many times is not preempted
  for priority any more; it runs to its end. Growth and budget count every preemption of
  the job (``JobState.preemptions``: for priority, reclaim or a defragmenting move).
* Quota *reclaim* is held by neither: it takes a job running on capacity borrowed above
  its team's guarantee once the job ran ``reclaim_min_runtime_s``, whatever its history.
  A guarantee is a promise to the other team, which a job's history does not revoke (as
  in KAI, where over-quota jobs stay reclaimable whatever their own class, and reclaim
  has its own min runtime apart from in-queue preemption's); the reclaim window keeps a
  reclaimed job from being reclaimed again soon, so reclaims between teams still settle.
* **Work lost** (``lost_gpu_s``): victims are ranked by the GPU-seconds they would lose,
  run time since their last checkpoint (since their start without one) times their GPUs.
* **A preemption pays for itself** (``wait_allowance``): its victims may lose,
  together and each, at most ``max_loss_per_wait`` times the GPU-time its
  beneficiary has waited (its GPUs times the time since it last entered the queue). Work
  that checkpoints loses little and goes at once; work that would lose hours goes only for
  a job that has waited long on many GPUs. This holds for priority and reclaim alike:
  without it a preemptor stops long-running jobs that do not checkpoint for jobs that
  would have started soon anyway (docs/design/scheduling-fairness.md, "With the preemptor").
  It binds every class and kind, best-effort victims and serving beneficiaries included:
  exempting either one let churn back (best-effort work placed in the gaps, stopped as
  its exempt time ends, placed and stopped again) and cost more than the waits it saved.

``Shield`` names why a running job is not a victim of a pending one: the typed answer the
preemptor gives when it explains itself (``victim_rules.SearchContext.shield``,
``decisions.why_no_victims``).
"""
from __future__ import annotations

import math
from enum import Enum

from gpusched.core.state import JobState

# How a reclaim's JobPreempted reason begins (``victim_rules.REASON_RECLAIM``, then ":").
RECLAIM_PREFIX = "reclaim:"


class Shield(str, Enum):
    """Why a running job is not a victim of a given pending job."""

    NOT_PREEMPTIBLE = "not-preemptible"     # its spec says so
    NOT_RUNNING = "not-running"             # pending, stopping or already being preempted
    EXEMPT = "exempt"                       # younger than its exempt time: not preemptible *yet*
    BUDGET_SPENT = "budget-spent"           # preempted preemption_budget times: not for priority
    NOT_LOWER = "not-lower-priority"        # its class is not below the pending job's, no reclaim
    GUARANTEED = "within-guarantee"         # a reclaim would take its team below its guarantee
    RECLAIM_WINDOW = "reclaimed-recently"   # reclaimed less than reclaim_window_s ago
    COSTLY = "costs-more-than-the-wait"     # would lose more than the pending job's wait allows
    SERVICE_MINIMUM = "service-minimum"     # a replica whose service would go below its min_replicas


def running_since(job: JobState) -> float:
    """When the attempt began running (started, or placed when it never started)."""
    return job.started_at or job.placed_at


def exempt_s(preemptions: int, base_s: float, growth: float, cap_s: float) -> float:
    """Minimum run time of an attempt before it may be preempted, for a job already
    preempted ``preemptions`` times: ``base_s * growth ** preemptions``, at most ``cap_s``
    (never below ``base_s``)."""
    if preemptions <= 0 or growth == 1.0:
        return base_s
    # growth ** preemptions overflows for absurd counts: stop once past the cap.
    grown = base_s
    for _ in range(preemptions):
        grown *= growth
        if grown >= cap_s:
            return max(base_s, cap_s)
    return grown


def lost_gpu_s(job: JobState, now: float) -> float:
    """GPU-seconds lost if ``job`` were stopped at ``now``: its work since the last
    checkpoint (its start without one) on all its GPUs."""
    return job.work_at_risk(now) * job.milli / 1000.0


def wait_allowance(job: JobState, now: float, loss_per_wait: float) -> float:
    """GPU-seconds of victims' work a preemption for the pending ``job`` may lose at
    ``now``: ``loss_per_wait`` times the GPU-time ``job`` has waited since it last entered
    the queue (no bound when ``loss_per_wait`` is infinite)."""
    if loss_per_wait == math.inf:
        return math.inf
    return loss_per_wait * max(0.0, now - job.pending_since) * job.milli / 1000.0


def reclaimed_within(job: JobState, now: float, window_s: float) -> bool:
    """``job`` was preempted for quota reclaim less than ``window_s`` before ``now``."""
    return now - job.preempted_at < window_s and job.preempted_reason.startswith(RECLAIM_PREFIX)


def budget_spent(job: JobState, budget: int) -> bool:
    """``budget`` 0: no budget."""
    return budget > 0 and job.preemptions >= budget
