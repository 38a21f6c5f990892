"""Read-side questions over a ``ClusterState`` (pool summaries), shared by services and tools."""
from __future__ import annotations

from dataclasses import dataclass

from gpusched.core.model import JobPhase, NodeStatus
from gpusched.core.state import ClusterState, NodeState
from gpusched.core.topology import DEFAULT_LEVELS, pool_levels


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
    topology_levels: tuple[str, ...] = DEFAULT_LEVELS   # top down: as declared, else the default

    @property
    def gpu_milli_free(self) -> int:
        return self.gpu_milli_capacity - self.gpu_milli_allocated

    @property
    def allocation_ratio(self) -> float:
        return self.gpu_milli_allocated / self.gpu_milli_capacity if self.gpu_milli_capacity else 0.0


def gpus_allocated_milli(state: ClusterState, node: NodeState) -> list[int]:
    """Per GPU of ``node``, the milli allocated on it by the rule a job's usage is counted
    by (``WorkerResources.milli``, what fair share and quotas charge a team): a whole GPU
    1000, a share its milli, a MIG slice its compute slices in sevenths of the GPU (a 3g
    slice 428, however many of the 8 memory slices it holds)."""
    allocated = [g.used_milli for g in node.gpus]
    name = node.info.name
    for job_id in node.jobs:
        job = state.jobs.get(job_id)
        if job is None or not job.phase.holds_gpus or not job.spec.resources.mig_profile:
            continue
        milli = job.spec.resources.milli
        for worker in job.workers:
            if worker.node == name:
                for slot in worker.gpus:
                    allocated[slot.index] += milli
    return allocated


def pool_summary(state: ClusterState, pool: str) -> PoolSummary:
    nodes = [n for n in state.nodes.values() if n.info.pool == pool and n.status is not NodeStatus.LOST]
    gpus = [g for n in nodes for g in n.gpus]
    jobs = [j for j in state.jobs.values() if j.spec.pool == pool]
    return PoolSummary(
        pool=pool, nodes=len(nodes), gpus=len(gpus),
        gpu_milli_capacity=1000 * len(gpus),
        gpu_milli_allocated=sum(sum(gpus_allocated_milli(state, n)) for n in nodes),
        pending_jobs=sum(1 for j in jobs if j.phase is JobPhase.PENDING and not j.array_tasks),   # an array: its tasks
        running_jobs=sum(1 for j in jobs if j.phase is JobPhase.RUNNING),
        cpu_milli_capacity=sum(n.info.cpu_milli for n in nodes),
        cpu_milli_allocated=sum(n.used_cpu for n in nodes),
        default_time_limit_s=state.pool_limits.get(pool, (0.0, 0.0))[0],
        max_time_limit_s=state.pool_limits.get(pool, (0.0, 0.0))[1],
        topology_levels=pool_levels(state.pool_topology, pool),
    )
