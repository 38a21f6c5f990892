"""What fits where: whether a node has room for one worker, and which GPUs it would take.

Shared by every placement policy, the topology planner, backfill and preemption, so they
all agree on what "fits" means.
"""
from __future__ import annotations

from typing import Mapping, Protocol

from gpusched.core.mig import largest_placeable, parse_profile
from gpusched.core.model import GpuSlot, NodeStatus, WorkerResources
from gpusched.core.state import NodeState, Usage


class StateLike(Protocol):
    """What placement needs of a state: the nodes, and usage to book against (a
    ``ClusterState``, or a preemption view sharing its nodes)."""

    nodes: Mapping[str, NodeState]

    def team_usage(self, team: str) -> Usage: ...


def fits_node(node: NodeState, res: WorkerResources) -> bool:
    return node.schedulable and node.free_cpu >= res.cpu_milli and node.free_mem >= res.memory_mib


def pick_gpus(node: NodeState, res: WorkerResources) -> tuple[GpuSlot, ...] | None:
    """The GPUs this worker would take on ``node`` (best-fit inside the node), or None."""
    if not res.allows(node.model):
        return None
    if res.is_mig:
        return pick_mig(node, res)
    if res.is_share:
        fits = [g for g in node.gpus if g.fits_share(res.gpu_milli, res.gpu_memory_mib)]
        if not fits:
            return None
        g = min(fits, key=lambda g: (g.free_milli, g.info.index))
        return (GpuSlot(g.info.index, res.gpu_milli),)
    free = [g.info.index for g in node.gpus if g.fits_whole()]
    if len(free) < res.gpus:
        return None
    return tuple(GpuSlot(i) for i in free[: res.gpus])


def pick_mig(node: NodeState, res: WorkerResources) -> tuple[GpuSlot, ...] | None:
    """A valid MIG slice: on a GPU already cut into MIG if any (keeps whole GPUs whole),
    at the start that leaves the largest profile still placeable on that GPU."""
    profile = parse_profile(res.mig_profile)
    best = None
    for g in node.gpus:
        if not g.takes_mig():
            continue   # refused at every start: skip the per-start checks
        for start in profile.starts:
            if g.fits_mig(profile, start):
                left = largest_placeable(g.mig_mask | profile.mask(start))
                key = (g.mig_mask == 0, -left, g.info.index, start)
                if best is None or key < best[0]:
                    best = (key, GpuSlot(g.info.index, profile.milli, res.mig_profile, start))
    return (best[1],) if best else None


def fit(node: NodeState, pool: str, res: WorkerResources) -> tuple[GpuSlot, ...] | None:
    """The slots ``res`` takes on ``node`` if it is a ready node of ``pool`` with room."""
    if node.info.pool != pool or not fits_node(node, res):
        return None
    return pick_gpus(node, res)


# --- which check fails: the fit rule above, one check at a time -------------------------
# Filter names, in the order ``first_failing`` tries them: what never changes while the
# node stays as registered first (pool, status, model), then the free GPUs, CPU, memory.
POOL, LOST, CORDONED, MODEL, GPUS, SHARE, MIG, CPU, MEMORY = (
    "pool", "lost", "cordoned", "model", "gpus", "share", "mig", "cpu", "memory")


def first_failing(node: NodeState, pool: str, res: WorkerResources) -> str:
    """The first check of ``fit`` that refuses one worker of ``res`` on ``node``, or ""
    when ``fit`` gives it slots (tested: "" exactly when ``fit`` is not None). For the
    pending reason (``placement.diagnosis``): it uses the same ``GpuState`` methods."""
    if node.info.pool != pool:
        return POOL
    if not node.schedulable:
        return LOST if node.status is NodeStatus.LOST else CORDONED
    if not res.allows(node.model):
        return MODEL
    if res.is_mig:
        if pick_mig(node, res) is None:
            return MIG
    elif res.is_share:
        if not any(g.fits_share(res.gpu_milli, res.gpu_memory_mib) for g in node.gpus):
            return SHARE
    elif res.gpus and node.free_whole_gpus() < res.gpus:
        return GPUS
    if node.free_cpu < res.cpu_milli:
        return CPU
    if node.free_mem < res.memory_mib:
        return MEMORY
    return ""
