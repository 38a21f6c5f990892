"""Placement: choose nodes and GPUs for every worker of a gang, or nothing.

A placement policy scores feasible nodes for one worker (lower is better); ``place_gang``
places workers one by one, booking each so the next sees it, and gives up the whole gang
if any worker does not fit (all-or-nothing).
"""
from __future__ import annotations

from typing import Callable

from gpusched.core.mig import parse_profile
from gpusched.core.model import GpuSlot, WorkerAssignment, WorkerResources
from gpusched.core.state import ClusterState, JobState, NodeState
from gpusched.policies.booking import Booking, tentative

NodeScore = Callable[[NodeState, WorkerResources, tuple[GpuSlot, ...]], float]
PLACEMENTS: dict[str, NodeScore] = {}


def register_placement(name: str):
    def wrap(fn: NodeScore) -> NodeScore:
        PLACEMENTS[name] = fn
        return fn
    return wrap


def pick_gpus(node: NodeState, res: WorkerResources) -> tuple[GpuSlot, ...] | None:
    """The GPUs this worker would take on ``node`` (best-fit inside the node), or None."""
    if not res.allows(node.model):
        return None
    if res.is_mig:
        profile = parse_profile(res.mig_profile)
        best = None
        for g in node.gpus:
            for start in profile.starts:
                if g.fits_mig(profile, start):
                    # Prefer GPUs already cut into MIG: keeps whole GPUs whole.
                    key = (g.mig_mask == 0, g.info.index, start)
                    if best is None or key < best[0]:
                        best = (key, GpuSlot(g.info.index, profile.milli, res.mig_profile, start))
                    break
        return (best[1],) if best else None
    if res.is_share:
        fits = [g for g in node.gpus if g.fits_share(res.gpu_milli)]
        if not fits:
            return None
        g = min(fits, key=lambda g: (g.free_milli, g.info.index))
        return (GpuSlot(g.info.index, res.gpu_milli),)
    free = [g.info.index for g in node.gpus if g.fits_whole()]
    if len(free) < res.gpus:
        return None
    return tuple(GpuSlot(i) for i in free[: res.gpus])


def fits_node(node: NodeState, res: WorkerResources) -> bool:
    return node.schedulable and node.free_cpu >= res.cpu_milli and node.free_mem >= res.memory_mib


@register_placement("best-fit")
def best_fit(node: NodeState, res: WorkerResources, slots: tuple[GpuSlot, ...]) -> float:
    """Fewest free GPU milli left on the node after placing: packs tightly."""
    taken = sum(s.milli for s in slots)
    return sum(g.free_milli for g in node.gpus if g.healthy) - taken


def place_gang(state: ClusterState, job: JobState, score: NodeScore,
               booking: Booking) -> tuple[WorkerAssignment, ...] | None:
    spec = job.spec
    res = spec.resources
    workers: list[WorkerAssignment] = []
    with tentative(state) as inner:
        for w in range(spec.workers):
            best = None
            for node in state.nodes.values():
                if node.info.pool != spec.pool or not fits_node(node, res):
                    continue
                slots = pick_gpus(node, res)
                if slots is None:
                    continue
                s = score(node, res, slots)
                if best is None or s < best[0]:
                    best = (s, node.name, slots)
            if best is None:
                return None
            assignment = WorkerAssignment(w, best[1], best[2])
            workers.append(assignment)
            inner.add(job, (assignment,))
    placed = tuple(workers)
    booking.add(job, placed)
    return placed
