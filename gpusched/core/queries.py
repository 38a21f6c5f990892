"""Read-side questions over a ``ClusterState`` (pool summaries), shared by services and tools."""
from __future__ import annotations

from dataclasses import dataclass

from gpusched.core.model import JobPhase, NodeStatus
from gpusched.core.state import ClusterState


@dataclass(frozen=True, slots=True)
class PoolSummary:
    pool: str
    nodes: int
    gpus: int
    gpu_milli_capacity: int
    gpu_milli_allocated: int
    pending_jobs: int
    running_jobs: int
    cpu_milli_capacity: int
    cpu_milli_allocated: int
    default_time_limit_s: float = 0.0
    max_time_limit_s: float = 0.0

    @property
    def gpu_milli_free(self) -> int:
        return self.gpu_milli_capacity - self.gpu_milli_allocated

    @property
    def allocation_ratio(self) -> float:
        return self.gpu_milli_allocated / self.gpu_milli_capacity if self.gpu_milli_capacity else 0.0


def gpu_milli_used(gpu) -> int:
    """Allocated milli of one GPU; MIG slices count by the memory slices they hold."""
    return gpu.used_milli + bin(gpu.mig_mask).count("1") * 1000 // 8


def pool_summary(state: ClusterState, pool: str) -> PoolSummary:
    nodes = [n for n in state.nodes.values() if n.info.pool == pool and n.status is not NodeStatus.LOST]
    gpus = [g for n in nodes for g in n.gpus]
    jobs = [j for j in state.jobs.values() if j.spec.pool == pool]
    return PoolSummary(
        pool=pool, nodes=len(nodes), gpus=len(gpus),
        gpu_milli_capacity=1000 * len(gpus),
        gpu_milli_allocated=sum(gpu_milli_used(g) for g in gpus),
        pending_jobs=sum(1 for j in jobs if j.phase is JobPhase.PENDING),
        running_jobs=sum(1 for j in jobs if j.phase is JobPhase.RUNNING),
        cpu_milli_capacity=sum(n.info.cpu_milli for n in nodes),
        cpu_milli_allocated=sum(n.used_cpu for n in nodes),
        default_time_limit_s=state.pool_limits.get(pool, (0.0, 0.0))[0],
        max_time_limit_s=state.pool_limits.get(pool, (0.0, 0.0))[1],
    )
