"""The preemptor's per-call index of candidate victims and worker slots, so that one
decision's search does not scan the pool.

``VictimIndex``: the running jobs that may be victims at all in this call, with what about
them is fixed for the call (``now`` is): their class, their exempt time, budget and reclaim
protection (``protection``) and the GPU-seconds they would lose. Each job is listed once
per node it runs on, ordered by ``bound`` — a lower bound of the rank (``set_key``) of
any victim set in which it is of the highest class — in two kinds of lists:

* for priority: jobs past their exempt time and within their budget (victims of any
  pending job of a higher class);
* for quota reclaim, one list per team: jobs past ``reclaim_min_runtime_s`` and not
  reclaimed within ``reclaim_window_s`` (victims of a reclaiming job of another team, of
  its class or lower, when wholly above their team's guarantee: decided at the question,
  as borrowing changes with the call's decisions).

``candidates`` merges the lists a pending job may take from, cheapest bound first: the
search (``indexed_search``) looks at nodes in that order and stops at the first bound above
the best set found, as no node further on can hold a cheaper one. Victims taken earlier in
the call stay listed and are skipped by eligibility; beneficiaries booked are not running
jobs and are never listed.

``SlotCounts``: the worker slots of one job shape (pool, resources, worker count) on every
node of its pool that has any, kept through the call's changes like the placer's views, so
that a search knows the pool's total without counting every node.
"""
from __future__ import annotations

import heapq
from itertools import takewhile
from typing import Iterable, Iterator, Mapping

from gpusched.core.model import JobPhase, WorkerResources
from gpusched.core.priority import priority_value
from gpusched.core.state import ClusterState, JobState, NodeState
from gpusched.policies.preemption.protection import budget_spent, lost_gpu_s, running_since
from gpusched.policies.preemption.victim_search import could_host, worker_slots
from gpusched.policies.statement import Statement

# (bound, 0 when the node runs a listed job spread over several nodes else 1, node, seq, job)
Entry = tuple[tuple, int, str, int, JobState]


def bound(job: JobState, now: float) -> tuple:
    """A lower bound of ``SearchContext.set_key`` for any set whose highest class is
    ``job``'s and which holds ``job``: that class; non-borrowed and reclaimed milli at least
    0; work lost at least ``job``'s own (every job's is >= 0); at least one job."""
    return (priority_value(job.spec.priority_class), 0, 0, round(lost_gpu_s(job, now), 6), 1)


class VictimIndex:
    """Candidate victims of one call, by pool (see the module doc)."""

    def __init__(self, state: ClusterState, jobs: Iterable[JobState], now: float, config, recent_reclaim) -> None:
        # ``config``: the call's PreemptionConfig; ``recent_reclaim(job)``: reclaimed
        # within the reclaim window (``victim_rules``).
        for_priority: dict[str, list[Entry]] = {}
        for_reclaim: dict[str, dict[str, list[Entry]]] = {}
        # Nodes running a listed job that spans nodes: a step there may gain slots on the
        # other nodes too (``IndexedSearch`` cannot bound its gain by the job's workers).
        self.spread: set[str] = set()
        listed: list[tuple[JobState, tuple, list[str], bool, bool]] = []
        running, placed, budget = JobPhase.RUNNING, JobPhase.PLACED, config.preemption_budget
        for job in jobs:   # every running job of the call: kept lean
            phase = job.phase
            if (phase is not running and phase is not placed) or not job.spec.preemptible:
                continue
            age = now - running_since(job)
            by_priority = age >= config.exempt_s(job) and not budget_spent(job, budget)
            by_reclaim = age >= config.reclaim_min_runtime_s and not recent_reclaim(job)
            if not by_priority and not by_reclaim:
                continue
            workers = job.workers
            if len(workers) == 1:
                names = [workers[0].node]
            else:
                names = sorted({w.node for w in workers})
                if len(names) > 1:
                    self.spread.update(names)
            listed.append((job, bound(job, now), names, by_priority, by_reclaim))
        pool_of = {name: node.info.pool for name, node in state.nodes.items()}
        spread = self.spread
        for job, key, names, by_priority, by_reclaim in listed:
            for name in names:
                pool = pool_of.get(name)
                if pool is None:
                    continue
                entry = (key, 0 if name in spread else 1, name, job.seq, job)
                if by_priority:
                    for_priority.setdefault(pool, []).append(entry)
                if by_reclaim:
                    for_reclaim.setdefault(pool, {}).setdefault(job.team, []).append(entry)
        self.for_priority = {pool: InOrder(entries) for pool, entries in for_priority.items()}
        self.for_reclaim = {pool: {team: InOrder(entries) for team, entries in teams.items()}
                            for pool, teams in for_reclaim.items()}

    def candidates(self, pool: str, mine: int, team: str, reclaim: bool) -> Iterator[Entry]:
        """Entries a pending job of class ``mine`` and ``team`` may take victims from
        (``reclaim``: it may reclaim its guarantee), by bound; a superset of its eligible
        victims on their nodes."""
        lists: list[Iterator[Entry]] = []
        if pool in self.for_priority:
            lists.append(takewhile(lambda e: e[0][0] < mine, self.for_priority[pool]))
        if reclaim:
            lists += [takewhile(lambda e: e[0][0] <= mine, entries)
                      for other, entries in self.for_reclaim.get(pool, {}).items() if other != team]
        return lists[0] if len(lists) == 1 else heapq.merge(*lists)


class InOrder:
    """Entries in order (by bound, then nodes running spread jobs first, then by node name:
    the search's tie-break among equal bounds; (node, seq) is unique, so a job is never
    compared), sorted as far as some walk has read: a decision reads only the head."""

    def __init__(self, entries: list[Entry]) -> None:
        heapq.heapify(entries)
        self._heap, self._sorted = entries, []

    def __iter__(self) -> Iterator[Entry]:
        i, done, heap = 0, self._sorted, self._heap
        while True:
            if i == len(done):
                if not heap:
                    return
                done.append(heapq.heappop(heap))
            yield done[i]
            i += 1


class SlotCounts:
    """Worker slots of ``res`` (at most ``cap`` a node) on the nodes of ``pool`` that could
    host it, as ``VictimSearch`` counts them; ``on`` holds the nodes with any, ``total``
    their sum. Told of changed nodes (``touch``) like any view of the placer."""

    def __init__(self, nodes: Mapping[str, NodeState], pool: str, res: WorkerResources, cap: int) -> None:
        self.nodes, self.pool, self.res, self.cap = nodes, pool, res, cap
        # Slots are counted by taking them on the nodes, then undone: on a statement of
        # its own, which tells no view.
        self._counter = Statement(ClusterState(nodes=nodes))
        self._hosts: dict[str, bool] = {}
        self.on: dict[str, int] = {}
        self.total = 0
        self.touch([name for name, node in nodes.items() if node.info.pool == pool])

    def touch(self, names: Iterable[str]) -> None:
        for name in names:
            node = self.nodes.get(name)
            if node is None or node.info.pool != self.pool:
                continue
            self.total -= self.on.pop(name, 0)
            if not node.schedulable:
                continue
            hosts = self._hosts.get(name)    # static capacity: asked only of nodes with slots
            n = worker_slots(self._counter, node, self.res, self.cap)
            if n and hosts is None:
                hosts = self._hosts[name] = could_host(node, self.res)
            if n and hosts:
                self.on[name] = n
                self.total += n
