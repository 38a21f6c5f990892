"""Fair share's arithmetic: the projection of what each team and org holds, and a team's
claim on the next job (tier, aging, weighted dominant shares). The order built from it is
``fairshare``'s; ``fair_queue`` keeps it between cycles."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

from gpusched.core.priority import priority_value
from gpusched.core.state import ClusterState, JobState, NodeState
from gpusched.policies.journal_cursor import JournalCursor
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


def _node_part(node: NodeState | None) -> Vector:
    """What ``node`` adds to ``cluster_capacity``."""
    if node is None or not node.schedulable:
        return (0, 0, 0)
    return (1000 * sum(1 for g in node.gpus if g.healthy), node.info.cpu_milli, node.info.memory_mib)


class KeptCapacity:
    """``cluster_capacity`` of one state kept between cycles: the sum reads only each
    node's status, GPUs' health, CPU and memory, which change only by node events, and
    the reducer journals the nodes those change (``ClusterState.node_changes``). So a
    cordon, a failed GPU or a registration (a node added, or its inventory taken again)
    re-adds those nodes' parts (the whole sum at 5,000 nodes was most of what a node event
    added to a cycle); an overrun journal or another state sum again. Integers: the kept
    sum is the fresh one exactly."""

    __slots__ = ("journal", "parts", "total")

    def __init__(self) -> None:
        self.journal = JournalCursor()
        self.parts: dict[str, Vector] = {}
        self.total: Vector = (0, 0, 0)

    def of(self, state: ClusterState) -> Vector:
        read = self.journal.read_nodes(state, jobs=False, registered=True)
        if read is None:
            self.parts = {name: _node_part(node) for name, node in state.nodes.items()}
            self.total = cluster_capacity(state)
            return self.total
        gpu, cpu, mem = self.total
        for name in dict.fromkeys(read[1]):
            og, oc, om = self.parts.pop(name, (0, 0, 0))
            ng, nc, nm = part = _node_part(state.nodes.get(name))
            if name in state.nodes:
                self.parts[name] = part
            gpu, cpu, mem = gpu - og + ng, cpu - oc + nc, mem - om + nm
        self.total = (gpu, cpu, mem)
        return self.total


def dominant_share(usage: Vector, capacity: Vector, weight: float) -> float:
    """DRF: the largest fraction of any resource's capacity held, over the weight."""
    return max((u / c for u, c in zip(usage, capacity) if c > 0), default=0.0) / weight


def is_aged(job: JobState, now: float, aging_s: float) -> bool:
    return now - job.submitted_at >= aging_s


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

    def __init__(self, state: ClusterState, context: QueueContext, teams: Iterable[str],
                 capacity: Vector | None = None) -> None:
        tree = context.tree
        # ``capacity``: the caller's ``cluster_capacity(state)``, if it keeps one.
        self.capacity = cluster_capacity(state) if capacity is None else capacity
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
        after, o = team.effective(), org.effective
        org.effective = (o[0] + after[0] - before[0], o[1] + after[1] - before[1], o[2] + after[2] - before[2])

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
