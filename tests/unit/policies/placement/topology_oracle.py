"""ORACLE, for tests only: a frozen copy of ``gpusched.policies.placement.topology``'s
``place_spread``/``plan_gang``/``node_capacity`` (and ``gang.place_gang``) as they were before
gang planning was made proportional to what a decision needs, for a pool on the default
levels (spine, rack), with the planner's choice among spines as it is now (the one needing
the fewest racks, then the fullest; where none takes the gang, the spines biggest first). The tests compare the
live planner's decisions with these, which computed every node's capacity and the
policy's rank of every candidate for every gang. Do not optimise or import from here
in the project.
"""
from __future__ import annotations


from collections import defaultdict
from typing import Callable, Mapping, Sequence

from gpusched.core.mig import parse_profile, slot_bit
from gpusched.core.model import WorkerAssignment, WorkerResources
from gpusched.core.state import GpuState, JobState, NodeState
from gpusched.policies.statement import Statement
from gpusched.policies.gpu_fit import StateLike, fit


Prefer = Callable[[Sequence[NodeState]], Mapping[str, int]]


def place_spread(state: StateLike, job: JobState, statement: Statement,
                 prefer: Prefer | None = None) -> tuple[WorkerAssignment, ...] | None:
    spec, res = job.spec, job.spec.resources
    plan = plan_gang([n for n in state.nodes.values() if n.info.pool == spec.pool], res, spec.workers, prefer)
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


def plan_gang(nodes: list[NodeState], res: WorkerResources, workers: int,
              prefer: Prefer | None = None) -> list[tuple[NodeState, int]] | None:
    """(node, workers there) for every worker, or None when the pool cannot take them all.
    ``prefer``: ranks of the nodes that take a worker (lower first), breaking ties."""
    caps = {n.name: c for n in nodes if (c := node_capacity(n, res, workers)) > 0}
    if sum(caps.values()) < workers:
        return None
    candidates = [n for n in nodes if n.name in caps]
    order = prefer(candidates) if prefer is not None else {n.name: i for i, n in enumerate(candidates)}
    racks: dict[tuple[str, str], list[NodeState]] = defaultdict(list)
    for n in nodes:
        if n.name in caps:
            racks[(n.info.label("spine"), n.info.label("rack"))].append(n)
    for members in racks.values():
        members.sort(key=lambda n: (-caps[n.name], order[n.name]))

    def rack_cap(key: tuple[str, str]) -> int:
        return sum(caps[n.name] for n in racks[key])

    def nodes_needed(key: tuple[str, str], left: int = workers) -> int:
        for i, n in enumerate(racks[key]):
            left -= caps[n.name]
            if left <= 0:
                return i + 1
        return len(racks[key]) + 1

    whole = [k for k in racks if rack_cap(k) >= workers]
    if whole:   # one rack: fewest nodes, then the rack left fullest, then the preferred
        best = min(whole, key=lambda k: (nodes_needed(k), rack_cap(k), order[racks[k][0].name]))
        chosen = [best]
    else:
        def top(keys: list[tuple[str, str]]) -> int:   # the first node of the racks: most workers, then order
            first = min((n for k in keys for n in racks[k][:1]), key=lambda n: (-caps[n.name], order[n.name]))
            return order[first.name]
        chosen = _fewest_racks(racks, rack_cap, workers, nodes_needed, top)
    members = sorted((n for k in chosen for n in racks[k]), key=lambda n: (-caps[n.name], order[n.name]))
    plan, left = [], workers
    for n in members:
        take = min(caps[n.name], left)
        plan.append((n, take))
        left -= take
        if not left:
            return plan
    return None


def _fewest_racks(racks: dict, rack_cap, workers: int, nodes_needed, top) -> list[tuple[str, str]]:
    """Biggest racks first, inside one spine when a spine can take the gang (the one
    needing the fewest racks, then the fullest, then the one whose first node comes
    first); else the spines biggest first, each whole but the last, which holds the
    rest in its one rack that fits best, else in its biggest racks."""
    spines: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for key in racks:
        spines[key[0]].append(key)

    def spine_cap(spine: str) -> int:
        return sum(map(rack_cap, spines[spine]))

    def take(keys: list[tuple[str, str]], left: int) -> list[tuple[str, str]]:
        out = []
        for k in sorted(keys, key=lambda k: (-rack_cap(k), k)):
            out.append(k)
            left -= rack_cap(k)
            if left <= 0:
                break
        return out

    fitting = [spine for spine in spines if spine_cap(spine) >= workers]
    if fitting:
        best = min(fitting, key=lambda sp: (len(take(spines[sp], workers)), spine_cap(sp), top(spines[sp])))
        return take(spines[best], workers)
    out, left = [], workers
    for spine in sorted(spines, key=lambda sp: (-spine_cap(sp), sp)):
        if spine_cap(spine) < left:
            out += spines[spine]
            left -= spine_cap(spine)
            continue
        whole = [k for k in spines[spine] if rack_cap(k) >= left]
        if whole:
            return out + [min(whole, key=lambda k: (nodes_needed(k, left), rack_cap(k), top([k])))]
        return out + take(spines[spine], left)
    return out


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


def oracle_place_gang(state: StateLike, job: JobState, policy, statement: Statement
                      ) -> tuple[WorkerAssignment, ...] | None:
    """``gang.place_gang`` as it was, on the frozen planner."""
    from gpusched.policies.placement.gang import node_ranks
    spec = job.spec
    if spec.workers == 1:
        choice = policy.choose(state, statement, job, spec.resources)
        if choice is None:
            return None
        placed = (WorkerAssignment(0, choice[0].name, choice[1]),)
        statement.book(job, placed)
        return placed
    return place_spread(state, job, statement,
                        lambda nodes: node_ranks(policy, state, statement, job, spec.resources, nodes))
