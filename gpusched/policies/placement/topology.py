"""Gang placement by topology: fewest racks, then fewest nodes, all workers or none.

Workers of a distributed job talk to each other every step, so the planner keeps them
close: first the fewest racks (node label ``rack``; racks under one ``spine`` label
preferred when one rack is not enough), then, inside the chosen racks, the fewest nodes
(nodes that take the most workers first). A worker never spans nodes, so its own GPUs
always share the node's NVLink; several workers on one node share it too. Where two
plans or nodes are alike by those criteria, the placement policy's preference decides
(``prefer``: its rank of the candidate nodes); without one, registration order. Inside
a node, a worker's GPUs are picked by ``fit``, as for every policy's chosen node.

The plan is made from how many workers each node takes right now (``node_capacity``,
kept by ``GangCapacities`` per call, and from cycle to cycle with the placement indexes,
and recomputed only for nodes changed since; for whole GPUs, a shape's first read asks
only the nodes the call's ``FreeIndex`` lists with enough free whole GPUs), then
booked worker by worker with the placer's own ``fit``; the gang is booked as one unit at
the end, or not at all. A policy with a ``rank_key`` is asked only about the nodes the
plan compares, not every candidate.
"""
from __future__ import annotations

import heapq
import sys
from collections import Counter, defaultdict
from typing import Callable, Iterable, Mapping, Sequence

from gpusched.core.mig import parse_profile, slot_bit
from gpusched.core.model import WorkerAssignment, WorkerResources
from gpusched.core.state import GpuState, JobState, NodeState
from gpusched.policies.statement import Statement
from gpusched.policies.gpu_fit import StateLike, fit
from gpusched.policies.placement.index import FreeIndex, holding, renew_members
from gpusched.policies.placement.kept_index import view as kept_view


Prefer = Callable[[Sequence[NodeState]], Mapping[str, int]]
# A policy's rank as a sort key (lower first, distinct per node): the same order as its
# ``prefer`` would give, computed only for the nodes a decision looks at.
RankKey = Callable[[NodeState], object]
UNBOUNDED = sys.maxsize


def place_spread(state: StateLike, job: JobState, statement: Statement,
                 prefer: Prefer | None = None, rank_key: RankKey | None = None,
                 ) -> tuple[WorkerAssignment, ...] | None:
    spec, res = job.spec, job.spec.resources
    view: GangCapacities = kept_view(statement, ("gang", spec.pool),   # type: ignore[assignment]
                                     lambda: GangCapacities(state.nodes, spec.pool))
    view.views = statement.views      # this call's indexes: a kept view outlives its statement
    plan = plan_gang(view, res, spec.workers, prefer, rank_key)
    if plan is None:
        return None
    mark = statement.checkpoint()
    placed: list[WorkerAssignment] = []
    for node, count in plan:
        for _ in range(count):
            slots = fit(node, spec.pool, res)
            if slots is None:            # capacity said yes, the GPUs say no: give up whole
                statement.rollback(mark)
                return None
            worker = WorkerAssignment(len(placed), node.name, slots)
            statement.book(job, (worker,))
            placed.append(worker)
    # Book the gang as one unit, as the reducer will apply it.
    statement.rollback(mark)
    gang = tuple(placed)
    statement.book(job, gang)
    return gang


class GangCapacities:
    """A statement's view of a pool for gangs: how many workers of each shape asked for
    each node takes (only nodes taking some), kept true lazily. A change only notes the
    node; a shape refreshes the nodes noted since it last looked, so a booking costs
    nothing here and a gang reads no node that did not change. A cycle that keeps indexes
    (``kept_index``) keeps this view too, told of the nodes changed between cycles: a
    gang then reads only the nodes changed since the last gang, not the whole pool."""

    MAX_SHAPES = 8     # shapes kept (the most recently asked); another is read afresh

    def __init__(self, nodes: Mapping[str, NodeState], pool: str,
                 views: Mapping[object, object] | None = None) -> None:
        self.nodes, self.pool, self.views = nodes, pool, views
        self.seq = {n.name: i for i, n in enumerate(nodes.values()) if n.info.pool == pool}
        self.rack = {name: (nodes[name].info.label("spine"), nodes[name].info.label("rack"))
                     for name in self.seq}
        self.changed: list[str] = []
        self.shapes: dict[WorkerResources, tuple[dict[str, int], int]] = {}

    def renew(self, names: Iterable[str]) -> None:
        """``names`` may have registered: the pool's nodes and their racks again (``touch``
        them next, so each shape counts them again)."""
        nodes = self.nodes
        renew_members(self.seq, nodes, names, lambda node: node.info.pool == self.pool)
        for name in names:
            if name in self.seq:
                self.rack[name] = (nodes[name].info.label("spine"), nodes[name].info.label("rack"))
            else:
                self.rack.pop(name, None)

    def touch(self, names: Iterable[str]) -> None:
        self.changed.extend(names)
        if len(self.changed) > len(self.seq) + 1024:   # reading the pool afresh costs less now
            self.changed, self.shapes = [], {}

    def capacities(self, res: WorkerResources) -> dict[str, int]:
        """{node: workers of ``res`` it takes now, uncapped} of the pool's nodes taking one."""
        known = self.shapes.pop(res, None)
        if known is None:
            caps = {n: c for n in self._holders(res) if (c := node_capacity(self.nodes[n], res, UNBOUNDED))}
            if len(self.shapes) >= self.MAX_SHAPES:
                del self.shapes[next(iter(self.shapes))]   # the least recently asked
        else:
            caps, seen = known
            for name in set(self.changed[seen:]):
                c = node_capacity(self.nodes[name], res, UNBOUNDED) if name in self.seq else 0
                if c:
                    caps[name] = c
                else:
                    caps.pop(name, None)   # takes none now, or left the pool
        self.shapes[res] = (caps, len(self.changed))
        if all(seen == len(self.changed) for _, seen in self.shapes.values()):
            self.changed = []                              # every shape has read them
            self.shapes = {r: (c, 0) for r, (c, _) in self.shapes.items()}
        return caps

    def _holders(self, res: WorkerResources) -> Iterable[str]:
        """Nodes that may take a worker of ``res``: for whole GPUs, those the statement's
        free-capacity index (best-fit's, kept between cycles; told of every change, so as
        true as the nodes) lists with enough free whole GPUs; else every node of the pool.
        Which nodes take a worker, and how many, is the same either way: ties are broken by
        rank and registration order, never by the order read here."""
        index = self.views.get(("free", self.pool)) if self.views is not None else None
        if isinstance(index, FreeIndex) and res.gpus and not res.is_share and not res.is_mig:
            return holding(index, res)
        return self.seq


def plan_gang(view: GangCapacities, res: WorkerResources, workers: int,
              prefer: Prefer | None = None, rank_key: RankKey | None = None,
              ) -> list[tuple[NodeState, int]] | None:
    """(node, workers there) for every worker, or None when the pool cannot take them all.
    Ties are broken by ``rank_key`` where given, else by ``prefer``: ranks of the nodes
    that take a worker (lower first), else by registration order."""
    caps = {name: min(c, workers) for name, c in view.capacities(res).items()}
    if sum(caps.values()) < workers:
        return None
    nodes = view.nodes
    if rank_key is None:
        candidates = [nodes[name] for name in sorted(caps, key=view.seq.__getitem__)]
        order = prefer(candidates) if prefer is not None else {n.name: i for i, n in enumerate(candidates)}

        def rank(n: NodeState) -> object:
            return order[n.name]
    else:
        rank = rank_key
    racks: dict[tuple[str, str], list[NodeState]] = defaultdict(list)
    for name in caps:
        racks[view.rack[name]].append(nodes[name])
    rack_caps = {k: sum(caps[n.name] for n in members) for k, members in racks.items()}

    def nodes_needed(key: tuple[str, str]) -> int:
        left, used = workers, 0
        for cap, count in sorted(Counter(caps[n.name] for n in racks[key]).items(), reverse=True):
            if left <= cap * count:
                return used + -(-left // cap)
            left, used = left - cap * count, used + count
        return used + 1

    def top(key: tuple[str, str]) -> object:   # the rack's first node: most workers, then rank
        most = max(caps[n.name] for n in racks[key])
        return min(rank(n) for n in racks[key] if caps[n.name] == most)

    whole = [k for k in racks if rack_caps[k] >= workers]
    if len(whole) == 1:
        chosen = whole
    elif whole:   # one rack: fewest nodes, then the rack left fullest, then the preferred
        chosen = [min(whole, key=lambda k: (nodes_needed(k), rack_caps[k], top(k)))]
    else:
        chosen = _fewest_racks(racks, rack_caps.__getitem__, workers)
    return _take([n for k in chosen for n in racks[k]], caps, rank, workers)


def _take(members: list[NodeState], caps: Mapping[str, int], rank: RankKey,
          workers: int) -> list[tuple[NodeState, int]] | None:
    """The nodes that take the most workers first, by rank among equals, until the gang is
    placed: ranks only the members of the last group it needs part of."""
    groups: dict[int, list[NodeState]] = defaultdict(list)
    for n in members:
        groups[caps[n.name]].append(n)
    plan, left = [], workers
    for cap in sorted(groups, reverse=True):
        group, needed = groups[cap], -(-left // cap)
        for n in sorted(group, key=rank) if needed >= len(group) else heapq.nsmallest(needed, group, key=rank):
            take = min(cap, left)
            plan.append((n, take))
            left -= take
            if not left:
                return plan
    return None


def _fewest_racks(racks: dict, rack_cap, workers: int) -> list[tuple[str, str]]:
    """Biggest racks first, inside one spine when a spine can take the gang."""
    spines: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for key in racks:
        spines[key[0]].append(key)

    def take(keys: list[tuple[str, str]]) -> list[tuple[str, str]]:
        out, left = [], workers
        for k in sorted(keys, key=lambda k: (-rack_cap(k), k)):
            out.append(k)
            left -= rack_cap(k)
            if left <= 0:
                break
        return out

    fitting = [take(keys) for keys in spines.values() if sum(map(rack_cap, keys)) >= workers]
    if fitting:
        return min(fitting, key=lambda ks: (len(ks), ks))
    return take(list(racks))


def node_capacity(node: NodeState, res: WorkerResources, cap: int) -> int:
    """How many workers of ``res`` (at most ``cap``) ``node`` takes right now."""
    if not node.schedulable or not res.allows(node.model):
        return 0
    n = cap
    if res.cpu_milli:
        n = min(n, node.free_cpu // res.cpu_milli)
    if res.memory_mib:
        n = min(n, node.free_mem // res.memory_mib)
    if res.is_mig:
        profile = parse_profile(res.mig_profile)
        slices = 0
        for g in node.gpus:
            if g.takes_mig():
                mask = g.mig_mask
                for start in profile.starts:   # left to right: the most slices of one width
                    if not mask & profile.mask(start) and g.mig_slots & slot_bit(profile, start):
                        mask |= profile.mask(start)
                        slices += 1
        n = min(n, slices)
    elif res.is_share:
        n = min(n, sum(_shares_left(g, res) for g in node.gpus if g.healthy and not g.mig_mask))
    elif res.gpus:
        n = min(n, node.free_whole_gpus() // res.gpus)
    return max(0, n)


def _shares_left(gpu: GpuState, res: WorkerResources) -> int:
    """How many more shares of ``res`` one GPU takes: by milli, and by GPU memory when the
    share asks for some."""
    n = gpu.free_milli // res.gpu_milli
    if res.gpu_memory_mib:
        n = min(n, max(0, gpu.info.memory_mib - gpu.used_memory_mib) // res.gpu_memory_mib)
    return n
