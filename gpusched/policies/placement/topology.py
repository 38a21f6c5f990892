"""Gang placement by topology: the fewest domains at every level, then the fewest nodes,
all workers or none.

Workers of a distributed job talk to each other every step, so the planner keeps them
close, by the pool's topology levels (``gpusched.core.topology``: declared from the top
down, e.g. ``spine``, ``rack``, ``block``; ``spine`` and ``rack`` where a pool declares
none). A domain is a node label's value under its parent's. The plan:

* the deepest domain that takes the whole gang alone: among those of that level, the one
  needing the fewest domains (or, at the lowest level, nodes) below it, then the fullest
  one (small gangs go to domains already broken, keeping whole ones free), then the
  policy's preferred;
* where none does, its children biggest first until the gang is covered, the last one
  holding the rest as compactly as it can;
* then, inside the chosen lowest-level domains, the fewest nodes (the nodes that take the
  most workers first).

A job's ``TopologyRequest`` bends it: ``required`` looks only at domains of that level or
below, and waits (None) where none takes the gang; ``preferred`` counts that level's
domains first when the gang must spread; a ``slice`` counts a domain of its level as
whole slices only, and books each slice's workers (consecutive numbers) inside one.

A worker never spans nodes, so its own GPUs always share the node's NVLink; several
workers on one node share it too. Where two plans or nodes are alike by those criteria,
the placement policy's preference decides (``prefer``: its rank of the candidate nodes);
without one, registration order. Inside a node, a worker's GPUs are picked by ``fit``, as
for every policy's chosen node.

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
from gpusched.core.model import TopologyRequest, WorkerAssignment, WorkerResources
from gpusched.core.state import GpuState, JobState, NodeState
from gpusched.core.topology import NO_REQUEST, domain_path, pool_levels
from gpusched.policies.statement import Statement
from gpusched.policies.gpu_fit import StateLike, fit
from gpusched.policies.placement.index import FreeIndex, holding, renew_members
from gpusched.policies.placement.kept_index import view as kept_view


Prefer = Callable[[Sequence[NodeState]], Mapping[str, int]]
# A policy's rank as a sort key (lower first, distinct per node): the same order as its
# ``prefer`` would give, computed only for the nodes a decision looks at.
RankKey = Callable[[NodeState], object]
UNBOUNDED = sys.maxsize
Domain = tuple[str, ...]   # a domain's path of labels from the top level down


def levels_of(state: StateLike, pool: str) -> tuple[str, ...]:
    """The pool's levels in ``state`` (a preemption's node-only copy carries them too)."""
    return pool_levels(getattr(state, "pool_topology", {}), pool)


def place_spread(state: StateLike, job: JobState, statement: Statement,
                 prefer: Prefer | None = None, rank_key: RankKey | None = None,
                 ) -> tuple[WorkerAssignment, ...] | None:
    spec, res = job.spec, job.spec.resources
    view = _gang_view(state, statement, spec.pool, levels_of(state, spec.pool))
    plan = plan_gang(view, res, spec.workers, prefer, rank_key, spec.topology)
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


def keep_domains_whole(state: StateLike, job: JobState, statement: Statement, chosen: NodeState,
                       prefer: Prefer) -> NodeState | None:
    """For a one-worker job the policy put in an untouched lowest-level domain of a pool
    that declares its levels: the node, among those that take it in domains already in
    use, the policy ranks first (None: keep its choice). Whole domains stay free for
    the gangs that need them; only pools that declare levels are bent so."""
    spec = job.spec
    declared = getattr(state, "pool_topology", {})
    if spec.pool not in declared:
        return None
    view = _gang_view(state, statement, spec.pool, pool_levels(declared, spec.pool))
    nodes, members = view.nodes, view.members
    in_use: dict[Domain, bool] = {}

    def used(leaf: Domain) -> bool:
        found = in_use.get(leaf)
        if found is None:
            found = in_use[leaf] = any(not _untouched(nodes[n]) for n in members[leaf])
        return found

    if chosen.name not in view.path or used(view.path[chosen.name]):
        return None
    candidates = [nodes[n] for n in sorted(view.capacities(spec.resources), key=view.seq.__getitem__)
                  if used(view.path[n])]
    if not candidates:
        return None
    ranks = prefer(candidates)
    return min(candidates, key=lambda n: ranks[n.name])


def _untouched(node: NodeState) -> bool:
    return not node.used_cpu and not node.used_mem and not any(g.used_milli or g.mig_mask for g in node.gpus)


def _gang_view(state: StateLike, statement: Statement, pool: str, levels: tuple[str, ...]) -> "GangCapacities":
    view: GangCapacities = kept_view(statement, ("gang", pool, levels),   # type: ignore[assignment]
                                     lambda: GangCapacities(state.nodes, pool, levels))
    view.views = statement.views      # this call's indexes: a kept view outlives its statement
    return view


class GangCapacities:
    """A statement's view of a pool for gangs: how many workers of each shape asked for
    each node takes (only nodes taking some), kept true lazily, and each node's domains
    under the pool's ``levels``. A change only notes the
    node; a shape refreshes the nodes noted since it last looked, so a booking costs
    nothing here and a gang reads no node that did not change. A cycle that keeps indexes
    (``kept_index``) keeps this view too, told of the nodes changed between cycles: a
    gang then reads only the nodes changed since the last gang, not the whole pool."""

    MAX_SHAPES = 8     # shapes kept (the most recently asked); another is read afresh

    def __init__(self, nodes: Mapping[str, NodeState], pool: str, levels: tuple[str, ...],
                 views: Mapping[object, object] | None = None) -> None:
        self.nodes, self.pool, self.levels, self.views = nodes, pool, levels, views
        self.seq = {n.name: i for i, n in enumerate(nodes.values()) if n.info.pool == pool}
        self.path = {name: domain_path(nodes[name].info, levels) for name in self.seq}
        self.members: dict[Domain, set[str]] = defaultdict(set)   # lowest-level domain -> its nodes
        for name, path in self.path.items():
            self.members[path].add(name)
        self.changed: list[str] = []
        self.shapes: dict[WorkerResources, tuple[dict[str, int], int]] = {}

    def renew(self, names: Iterable[str]) -> None:
        """``names`` may have registered: the pool's nodes and their domains again
        (``touch`` them next, so each shape counts them again)."""
        nodes = self.nodes
        renew_members(self.seq, nodes, names, lambda node: node.info.pool == self.pool)
        for name in names:
            before = self.path.pop(name, None)
            if before is not None:
                self.members[before].discard(name)
            if name in self.seq:
                path = self.path[name] = domain_path(nodes[name].info, self.levels)
                self.members[path].add(name)
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
              request: TopologyRequest = NO_REQUEST) -> list[tuple[NodeState, int]] | None:
    """(node, workers there) for every worker, in worker order, or None when the pool
    cannot take them all as ``request`` asks. Ties are broken by ``rank_key`` where given,
    else by ``prefer``: ranks of the nodes that take a worker (lower first), else by
    registration order."""
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
    tree = DomainTree(view.levels, {name: view.path[name] for name in caps}, caps, nodes, request)
    leaves = tree.choose(workers, rank)
    if leaves is None:
        return None
    if not tree.slice_size:
        return _take([nodes[n] for leaf in leaves for n in tree.members[leaf]], caps, rank, workers)
    plan: list[tuple[NodeState, int]] = []
    left, groups = workers, defaultdict(list)
    for leaf in leaves:   # each slice domain's chosen leaves, in the order chosen
        groups[leaf[:tree.slice_depth + 1]].append(leaf)
    for members in groups.values():
        names = [n for leaf in members for n in tree.members[leaf]]
        count = min(left, sum(caps[n] for n in names) // tree.slice_size * tree.slice_size)
        if count:
            part = _take([nodes[n] for n in names], caps, rank, count)
            if part is None:
                return None
            plan += part
            left -= count
    return plan if not left else None


class DomainTree:
    """The candidate nodes of one gang by domain, how many workers each domain takes (a
    slice's domain: whole slices only), and the choice of the lowest-level domains to use."""

    def __init__(self, levels: tuple[str, ...], paths: Mapping[str, Domain], caps: Mapping[str, int],
                 nodes: Mapping[str, NodeState], request: TopologyRequest) -> None:
        depth = {level: i for i, level in enumerate(levels)}
        self.bottom = len(levels) - 1                      # the lowest level's depth
        # A level the pool no longer has (its levels changed since the job was submitted):
        # a required level or a slice cannot be honoured (-2), a preference is dropped.
        self.required = depth.get(request.required, -2) if request.required else -1
        self.preferred = depth.get(request.preferred, -1) if request.preferred else -1
        self.slice_depth = depth.get(request.slice.level, -2) if request.slice.level else -1
        self.slice_size = request.slice.workers if self.slice_depth >= 0 else 0
        self.caps, self.nodes = caps, nodes
        self.rank: RankKey = lambda node: 0
        self.members: dict[Domain, list[str]] = defaultdict(list)   # lowest-level domain -> its nodes
        for name, path in paths.items():
            self.members[path].append(name)
        raw: dict[Domain, int] = defaultdict(int)          # every domain -> workers its nodes take
        self.at: list[list[Domain]] = [[] for _ in levels]  # depth -> its domains
        for leaf, names in self.members.items():
            took = sum(caps[n] for n in names)
            for d in range(self.bottom + 1):
                key = leaf[:d + 1]
                if key not in raw:
                    self.at[d].append(key)
                raw[key] += took
        self.cap = dict(raw)                               # every domain -> workers it takes
        if self.slice_size:   # a slice's domain takes whole slices; those above add them up
            for key in self.at[self.slice_depth]:
                whole = raw[key] // self.slice_size * self.slice_size
                for d in range(self.slice_depth + 1):
                    self.cap[key[:d + 1]] -= raw[key] - whole

    def choose(self, workers: int, rank: RankKey) -> list[Domain] | None:
        """The lowest-level domains the gang uses, in the order its workers fill them, or
        None where the request cannot be met."""
        if self.required == -2 or self.slice_depth == -2:
            return None
        self.rank = rank
        return self._select((), workers, lowest=max(self.required, 0), required=self.required >= 0)

    def _select(self, scope: Domain, n: int, lowest: int = 0, required: bool = False) -> list[Domain] | None:
        """Lowest-level domains under ``scope`` taking ``n``: the deepest one domain that
        takes them all (at ``lowest``, or the preferred level, or below), else ``scope``'s
        parts biggest first (the preferred level's, where the gang has one)."""
        depth = len(scope)
        if depth > self.bottom:
            return [scope]
        top = max(depth, lowest, self.preferred)
        for d in range(self.bottom, top - 1, -1):
            fitting = [k for k in self.at[d] if self.cap[k] >= n and k[:depth] == scope]
            if not fitting:
                continue
            if d == self.bottom:   # the fewest nodes, then the fullest, then the preferred
                return [min(fitting, key=lambda k: (self._nodes_needed(k, n), self.cap[k], self._top(k)))]
            best = min(fitting, key=lambda k: (self._parts_needed(k, d + 1, n), self.cap[k], self._top(k)))
            return self._spread(best, d + 1, n)
        if top > max(depth, lowest):   # no one preferred domain takes it: the fewest of them
            if not required:
                return self._spread(scope, self.preferred, n)
            fitting = [k for k in self.at[lowest] if self.cap[k] >= n and k[:depth] == scope]
            if not fitting:
                return None
            best = min(fitting, key=lambda k: (self._parts_needed(k, self.preferred, n), self.cap[k], self._top(k)))
            return self._spread(best, self.preferred, n)
        return None if required else self._spread(scope, depth, n)

    def _spread(self, scope: Domain, unit: int, n: int) -> list[Domain] | None:
        """``scope``'s domains at depth ``unit``, biggest first, until they take ``n``: each
        whole but the last, which holds the rest as compactly as it can."""
        chosen: list[Domain] = []
        for part in self._parts(scope, unit):
            if self.cap[part] >= n:
                rest = self._select(part, n)
                return None if rest is None else chosen + rest
            chosen += [leaf for leaf in self.members if leaf[:unit + 1] == part]
            n -= self.cap[part]
        return None

    def _parts(self, scope: Domain, unit: int) -> list[Domain]:
        return sorted((k for k in self.at[unit] if k[:len(scope)] == scope and self.cap[k]),
                      key=lambda k: (-self.cap[k], k))

    def _parts_needed(self, key: Domain, unit: int, n: int) -> int:
        used = 0
        for part in self._parts(key, unit):
            used, n = used + 1, n - self.cap[part]
            if n <= 0:
                break
        return used

    def _nodes_needed(self, leaf: Domain, n: int) -> int:
        caps, used = self.caps, 0
        for cap, count in sorted(Counter(caps[name] for name in self.members[leaf]).items(), reverse=True):
            if n <= cap * count:
                return used + -(-n // cap)
            n, used = n - cap * count, used + count
        return used + 1

    def _top(self, key: Domain) -> object:
        """The domain's first node: the most workers, then rank."""
        names = [n for leaf, members in self.members.items() if leaf[:len(key)] == key for n in members]
        most = max(self.caps[n] for n in names)
        return min(self.rank(self.nodes[n]) for n in names if self.caps[n] == most)


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
