"""The dynamic simulator's network topology: nodes in blocks, blocks in racks; what the
gangs ask of them; and how compact their placements were.

``--topology B,R`` labels the workload's nodes in their order: node i is in block i // B,
block b in rack b // R (labels ``rack=r<k>`` and ``block=r<k>-b<j>``, j the block's index
in its rack), so every node has one domain path (rack, block). The pool's levels are then
``declared`` (a ``PoolTopologySet`` of ``LEVELS`` at time 0, so the gang planner sees
blocks), or left ``default`` (``core.topology.DEFAULT_LEVELS``: the planner sees racks
only, the placement before levels could be declared). Each multi-node gang may ask for a
``TopologyRequest`` (``GANG_REQUESTS``).

A *multi-node gang* is a job of several workers that no single empty node of the workload
can hold all of: its workers need more than one node (``multi_node``). Its placements are
judged by ``compactness``: the share of its placements (every attempt placed counts) whose
workers are all inside one domain of each level, from the nodes the placement names and
their labels; and its waits by its size, in GPUs asked.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable, Mapping, Sequence

import numpy as np

from gpusched.core.model import JobSpec, NodeInfo, TopologyRequest, WorkerResources
from gpusched.core.topology import DEFAULT_LEVELS

LEVELS = ("rack", "block")          # what the simulated nodes are labelled by, top down
POOL_LEVELS = ("declared", "default")
# What a multi-node gang asks for; ``required-rack`` only where one rack can hold it.
GANG_REQUESTS = {"none": TopologyRequest(), "preferred-block": TopologyRequest(preferred="block"),
                 "required-rack": TopologyRequest(required="rack")}


@dataclass(frozen=True, slots=True)
class GangPlacement:
    """One placement (attempt) of a multi-node gang: each worker's node, in worker order."""

    job_id: str
    attempt: int
    gpus: float                     # GPUs the gang asks for in all
    nodes: tuple[str, ...]


def parse_topology(text: str) -> tuple[int, int]:
    """``"4,4"`` -> (nodes a block, blocks a rack), both at least 1."""
    try:
        block, rack = (int(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"--topology: BLOCK_NODES,RACK_BLOCKS, e.g. 4,4; got {text!r}") from None
    if block < 1 or rack < 1:
        raise ValueError(f"--topology: both numbers at least 1, got {text!r}")
    return block, rack


def label_nodes(nodes: Sequence[NodeInfo], block_nodes: int, rack_blocks: int) -> tuple[NodeInfo, ...]:
    """The nodes with labels ``rack`` and ``block`` (other labels of those keys replaced)."""
    out = []
    for i, node in enumerate(nodes):
        block = i // block_nodes
        rack = block // rack_blocks
        kept = tuple((k, v) for k, v in node.labels if k not in LEVELS)
        out.append(replace(node, labels=kept + (("rack", f"r{rack}"), ("block", f"r{rack}-b{block % rack_blocks}"))))
    return tuple(out)


def domain_paths(nodes: Iterable[NodeInfo], levels: Sequence[str] = LEVELS) -> dict[str, tuple[str, ...]]:
    """node -> its labels at ``levels``, top down: its domain at level i is ``path[:i + 1]``."""
    return {n.name: tuple(n.label(level) for level in levels) for n in nodes}


def workers_on_empty(node: NodeInfo, res: WorkerResources) -> int:
    """How many workers of ``res`` the node holds when nothing runs on it."""
    if not res.allows(node.gpus[0].model if node.gpus else ""):
        return 0
    counts = []
    if res.gpus:
        counts.append(len(node.gpus) // res.gpus)
    elif res.gpu_milli:
        counts.append(len(node.gpus) * (1000 // res.gpu_milli))
    if res.cpu_milli:
        counts.append(node.cpu_milli // res.cpu_milli)
    if res.memory_mib:
        counts.append(node.memory_mib // res.memory_mib)
    return min(counts) if counts else 1 << 30


def multi_node(spec: JobSpec, nodes: Sequence[NodeInfo]) -> bool:
    """A gang whose workers need more than one node: no empty node of its pool holds them all."""
    if spec.workers < 2:
        return False
    return max((workers_on_empty(n, spec.resources) for n in nodes if n.pool == spec.pool), default=0) < spec.workers


def fits_one(spec: JobSpec, nodes: Sequence[NodeInfo], level: str, levels: Sequence[str] = LEVELS) -> bool:
    """Whether one domain of ``level``, empty, holds all the gang's workers."""
    cut = list(levels).index(level) + 1
    held: dict[tuple[str, ...], int] = {}
    for n in nodes:
        if n.pool == spec.pool:
            key = tuple(n.label(lv) for lv in levels)[:cut]
            held[key] = held.get(key, 0) + workers_on_empty(n, spec.resources)
    return max(held.values(), default=0) >= spec.workers


def gang_request(spec: JobSpec, nodes: Sequence[NodeInfo], gangs: str) -> TopologyRequest:
    """What a multi-node gang asks for under ``gangs`` (``GANG_REQUESTS``): ``required-rack``
    gives a gang no rack can hold no request (it would wait forever); other jobs ask nothing."""
    request = GANG_REQUESTS[gangs]
    if not multi_node(spec, nodes) or (request.required and not fits_one(spec, nodes, request.required)):
        return TopologyRequest()
    return request


def with_topology(wl, block_nodes: int, rack_blocks: int, pool_levels: str = "declared", gangs: str = "none"):
    """``wl`` on labelled nodes, its pools' levels ``declared`` (``LEVELS``) or left
    ``default``, and its multi-node gangs asking for ``gangs``."""
    if pool_levels not in POOL_LEVELS:
        raise ValueError(f"topology levels: one of {', '.join(POOL_LEVELS)}, got {pool_levels!r}")
    if gangs not in GANG_REQUESTS:
        raise ValueError(f"gang topology: one of {', '.join(GANG_REQUESTS)}, got {gangs!r}")
    nodes = label_nodes(wl.nodes, block_nodes, rack_blocks)
    arrivals = tuple(replace(a, spec=replace(a.spec, topology=gang_request(a.spec, nodes, gangs)))
                     for a in wl.arrivals)
    pools = sorted({n.pool for n in nodes})
    declared = tuple((p, LEVELS) for p in pools) if pool_levels == "declared" else ()
    return replace(wl, nodes=nodes, arrivals=arrivals, pool_levels=declared, topology=LEVELS,
                   note=f"{wl.note}; blocks of {block_nodes} nodes, racks of {rack_blocks} blocks")


def topology_name(pool_levels: str, gangs: str) -> str:
    """A run's name among others on the same topology: ``<levels>/<gangs>``."""
    return f"{pool_levels}/{gangs}"


def valid_pair(pool_levels: str, gangs: str) -> bool:
    """Whether the pool's levels have the level the gangs name (a request naming a level
    the pool lacks is refused at submission)."""
    request = GANG_REQUESTS[gangs]
    have = LEVELS if pool_levels == "declared" else DEFAULT_LEVELS
    return all(not lv or lv in have for lv in (request.required, request.preferred, request.slice.level))


def within_one(placement: GangPlacement, paths: Mapping[str, tuple[str, ...]]) -> tuple[bool, ...]:
    """For each level, top down: whether all the placement's workers are in one domain of it."""
    depth = len(next(iter(paths.values()))) if paths else 0
    return tuple(len({paths[n][:i + 1] for n in placement.nodes}) == 1 for i in range(depth))


def _waits(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"mean": None, "p99": None}
    a = np.asarray(values, dtype=float)
    return {"mean": float(a.mean()), "p99": float(np.percentile(a, 99))}


def size_name(gpus: float) -> str:
    return f"{gpus:g}"


def compactness(placements: Sequence[GangPlacement], paths: Mapping[str, tuple[str, ...]],
                levels: Sequence[str], jobs: Sequence, gangs: set[str]) -> dict:
    """The run's figures by topology: over the multi-node gangs' placements (``gangs``: the
    ids of the jobs that are multi-node gangs), the share within one domain of each level;
    the same and the gangs' waits (to their first start) by size, in GPUs asked; and the
    waits of every other job. ``jobs``: the run's ``JobRecord``s."""
    def shares(ps: Sequence[GangPlacement]) -> dict:
        inside = [within_one(p, paths) for p in ps]
        return {f"within_one_{level}": (sum(x[i] for x in inside) / len(inside) if inside else None)
                for i, level in enumerate(levels)}

    mine = [j for j in jobs if j.job_id in gangs]
    by_size = {}
    for gpus in sorted({j.milli / 1000 for j in mine}):
        sized = [j for j in mine if j.milli / 1000 == gpus]
        ps = [p for p in placements if p.gpus == gpus]
        by_size[size_name(gpus)] = {
            "jobs": len(sized), "placements": len(ps), **shares(ps),
            "wait_s": _waits([j.started_at - j.submitted_at for j in sized if j.started_at is not None]),
            "never_ran": sum(1 for j in sized if j.started_at is None)}
    others = [j.started_at - j.submitted_at for j in jobs if j.job_id not in gangs and j.started_at is not None]
    return {"levels": list(levels), "gangs": len(mine), "placements": len(placements), **shares(placements),
            "by_size": by_size, "other_jobs_wait_s": _waits(others)}
