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
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from gpusched.core.priority import priority_value
from gpusched.core.state import ClusterState, JobState
from gpusched.policies.queueing.quota import QueueTree, claims_guarantee
from gpusched.policies.queueing.usage import ZERO, Demand

DEFAULT_AGING_S = 6 * 3600.0


@dataclass(frozen=True, slots=True)
class QueueContext:
    """What a queue order may know beyond the state: quotas, decayed usage, aging."""

    tree: QueueTree = field(default_factory=QueueTree)
    decayed: Mapping[str, Demand] = field(default_factory=dict)   # team -> UsageLedger.decayed()
    aging_s: float = DEFAULT_AGING_S                               # <= 0: no aging
    # Jobs that go ahead of all others (preemption beneficiaries, whose capacity was freed
    # for them): charged to their teams before any other job is ranked, so the tiers of
    # the rest count them as placed — as the preemptor, which counts them as held, does.
    nominees: frozenset[str] = frozenset()


Vector = tuple[float, float, float]   # GPU milli, CPU milli, memory MiB: what DRF compares


def job_demand(job: JobState) -> Vector:
    res = job.spec.resources
    return (job.milli, res.cpu_milli * job.spec.workers, res.memory_mib * job.spec.workers)


def cluster_capacity(state: ClusterState) -> Vector:
    gpu = cpu = mem = 0
    for node in state.nodes.values():
        if node.schedulable:
            gpu += 1000 * sum(1 for g in node.gpus if g.healthy)
            cpu += node.info.cpu_milli
            mem += node.info.memory_mib
    return (gpu, cpu, mem)


def dominant_share(usage: Vector, capacity: Vector, weight: float) -> float:
    """DRF: the largest fraction of any resource's capacity held, over the weight."""
    return max((u / c for u, c in zip(usage, capacity) if c > 0), default=0.0) / weight


def is_aged(job: JobState, now: float, aging_s: float) -> bool:
    return now - job.submitted_at >= aging_s


def _within_team_key(job: JobState, now: float, aging_s: float) -> tuple:
    if is_aged(job, now, aging_s):
        return (0, job.seq)
    return (1, -priority_value(job.spec.priority_class), job.seq)


@dataclass(slots=True)
class _Team:
    """A team's quota and usage as plain floats: this is the inner loop of a cycle."""

    org: str
    guaranteed: float
    limit: float
    weight: float
    held: Vector                 # held now, plus what the order so far gave it
    decayed: Vector

    def effective(self) -> Vector:
        h, d = self.held, self.decayed
        return (max(h[0], d[0]), max(h[1], d[1]), max(h[2], d[2]))


@dataclass(slots=True)
class _Org:
    guaranteed: float
    limit: float
    weight: float
    held_milli: float = 0.0
    effective: Vector = (0.0, 0.0, 0.0)   # sum of its teams' effective usage


class _Projection:
    """What each team and org holds, plus what the order built so far gave it."""

    def __init__(self, state: ClusterState, context: QueueContext, teams: Iterable[str]) -> None:
        tree = context.tree
        self.capacity = cluster_capacity(state)
        self.teams: dict[str, _Team] = {}
        self.orgs: dict[str, _Org] = {}
        for team in sorted(set(teams) | set(state.usage) | set(tree.teams())):
            org, quota, usage = tree.org_of(team), tree.team_quota(team), state.usage.get(team)
            d = context.decayed.get(team, ZERO)
            held = (usage.gpu_milli, usage.cpu_milli, usage.memory_mib) if usage else (0.0, 0.0, 0.0)
            acc = self.teams[team] = _Team(org, quota.guaranteed_milli, quota.limit_milli, quota.weight, held,
                                           (d.gpu_milli, d.cpu_milli, d.memory_mib))
            if org not in self.orgs:
                oq = tree.org_quota(org)
                self.orgs[org] = _Org(oq.guaranteed_milli, oq.limit_milli, oq.weight)
            self.orgs[org].held_milli += held[0]
            self.orgs[org].effective = _plus(self.orgs[org].effective, acc.effective())

    def charge(self, job: JobState, demand: Vector) -> None:
        team = self.teams[job.team]
        org = self.orgs[team.org]
        before = team.effective()
        team.held = _plus(team.held, demand)
        org.held_milli += demand[0]
        org.effective = tuple(o + a - b for o, a, b in zip(org.effective, team.effective(), before))

    def tier(self, job: JobState, milli: float) -> int:
        team = self.teams[job.team]
        org = self.orgs[team.org]
        if claims_guarantee(team.held[0], milli, team.guaranteed):
            return 0
        if team.org and claims_guarantee(org.held_milli, milli, org.guaranteed):
            return 1
        if team.held[0] + milli <= team.limit and (not team.org or org.held_milli + milli <= org.limit):
            return 2
        return 3

    def claim(self, head: JobState, milli: float, now: float, aging_s: float) -> tuple:
        tier = self.tier(head, milli)
        if is_aged(head, now, aging_s):
            return (tier, 0, head.seq)
        team = self.teams[head.team]
        team_share = dominant_share(team.effective(), self.capacity, team.weight)
        # Teams outside any org compete as if each were an org of its own.
        org = self.orgs[team.org]
        org_share = dominant_share(org.effective, self.capacity, org.weight) if team.org else team_share
        return (tier, 1, org_share, team_share, -priority_value(head.spec.priority_class), head.seq)


def tier_of(state: ClusterState, job: JobState, tree: QueueTree) -> int:
    """The tier ``job`` would rank in were it its team's next job (nothing else projected):
    0 it is claimed against its team's guarantee, 1 against its org's, 2 borrowed within
    the limits, 3 over a limit. For reports and for tests that hold the cycle's view of who
    borrows against the preemptor's."""
    return _Projection(state, QueueContext(tree), (job.team,)).tier(job, job.milli)


def _plus(a: Vector, b: Vector) -> Vector:
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2])


def fair_share(state: ClusterState, jobs: Iterable[JobState], now: float,
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

