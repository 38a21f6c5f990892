"""Test oracle: fair share's order built whole, as ``fairshare.fair_share`` did before the
order was kept in per-team queues (``policies.queueing.fair_queue``): every job sorted
into its team's queue, then repeatedly the head of the team with the best claim, charged
to its team, the charged team's org re-ranked by a scan. Kept here, unchanged, for
tests/unit/policies/queueing/test_fair_queue.py to hold the lazy order against; not used by the
scheduler."""
from __future__ import annotations

import math
from typing import Iterable

from gpusched.core.state import ClusterState, JobState
from gpusched.core.priority import priority_value
from gpusched.policies.queueing.shares import QueueContext, _Projection, is_aged, job_demand


def _within_team_key(job: JobState, now: float, aging_s: float) -> tuple:
    if is_aged(job, now, aging_s):
        return (0, job.seq)
    return (1, -priority_value(job.spec.priority_class), job.seq)


def fair_share_whole(state: ClusterState, jobs: Iterable[JobState], now: float,
                     context: QueueContext | None = None) -> list[JobState]:
    context = context or QueueContext()
    aging_s = context.aging_s if context.aging_s > 0 else math.inf
    queues: dict[str, list[JobState]] = {}
    for job in jobs:
        queues.setdefault(job.team, []).append(job)
    for queue in queues.values():
        queue.sort(key=lambda j: _within_team_key(j, now, aging_s), reverse=True)   # pop() = head
    demand = {j.job_id: job_demand(j) for queue in queues.values() for j in queue}
    projection = _Projection(state, context, queues)
    order: list[JobState] = []
    if context.nominees:
        for team, queue in queues.items():
            for job in [j for j in reversed(queue) if j.job_id in context.nominees]:
                order.append(job)
                projection.charge(job, demand[job.job_id])
            queue[:] = [j for j in queue if j.job_id not in context.nominees]
        queues = {team: queue for team, queue in queues.items() if queue}
    org_of = {team: projection.teams[team].org for team in queues}

    def claim(team: str) -> tuple:
        head = queues[team][-1]
        return projection.claim(head, demand[head.job_id][0], now, aging_s)

    claims = {team: claim(team) for team in queues}
    while claims:
        team = min(claims, key=claims.__getitem__)
        job = queues[team].pop()
        order.append(job)
        projection.charge(job, demand[job.job_id])
        # The charge moved this team's shares and its org's: re-rank the org's teams.
        org = org_of[team]
        for other in [t for t in claims if t == team or (org and org_of[t] == org)]:
            if queues[other]:
                claims[other] = claim(other)
            else:
                del claims[other]
    return order

