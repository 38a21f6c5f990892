"""Fair-share queue order: guarantees first, then weighted DRF over decayed usage, with aging.

The order is built the way DRF allocates (progressive filling): repeatedly take the head
job of the team that deserves the next job most, and charge that job to the team as if
it were placed, so one cycle interleaves teams instead of serving one team's whole queue.
A team's claim on the next job, best first:

1. *tier* of the head job, given what the team (and its org) holds plus what this order
   already gave it: 0 fits in the team's guarantee, 1 fits in its org's guarantee
   (borrowing from an idle sibling team), 2 borrows from other orgs within the limits,
   3 would exceed a limit (kept in the order so it stays a permutation of the pending set;
   the scheduler skips it). Under-quota teams therefore come before borrowers.
2. *aged* heads (waited ``aging_s`` or more) before the others, oldest first, so no job
   waits forever behind teams with smaller shares.
3. weighted dominant share of the org, then of the team: max over GPU milli, CPU milli and
   memory of usage / cluster capacity, divided by the weight, where usage is the larger of
   what is held now (plus this order's projection) and the decayed average (``usage``).
4. priority class, then submission order.

Within a team, aged jobs come first, then by priority class and submission order.

Preemption beneficiaries (``QueueContext.nominees``) come first of all, charged before
the others are ranked: their teams' tiers then count them, as the preemptor does.
"""
from __future__ import annotations

import math
from typing import Iterable

from gpusched.core.state import ClusterState, JobState
from gpusched.policies.queueing.fair_queue import TeamQueues
from gpusched.policies.queueing.shares import (  # noqa: F401  (the names fair share is used by)
    DEFAULT_AGING_S, QueueContext, cluster_capacity, dominant_share, is_aged, job_demand, tier_of,
)


def fair_share(state: ClusterState, jobs: Iterable[JobState], now: float,
               context: QueueContext | None = None) -> list[JobState]:
    """The whole order of ``jobs`` (a cycle takes it lazily from the queues its caller
    keeps: ``fair_queue.TeamQueues``, the same order)."""
    context = context or QueueContext()
    queues = TeamQueues()
    queues.fill(jobs, now, context.aging_s if context.aging_s > 0 else math.inf)
    return list(queues.order(state, now, context))
