"""What a dynamic simulation replays: a cluster, jobs arriving over time, and quotas.

A job's ``spec.simulated_duration_s`` is how long it runs once started; its
``spec.max_runtime_s`` is the estimate schedulers may use (backfill). The openb trace
(Weng et al., ATC'23) gives both as the task's lifetime (deletion - creation); its nodes
and task resources are read by ``gpusched.sim.traces``, shared with the static benchmark.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

from gpusched.core.catalog import CATALOG
from gpusched.core.model import GpuInfo, JobKind, JobSpec, NodeInfo
from gpusched.policies.queueing.quota import QueueTree
from gpusched.sim import traces


@dataclass(frozen=True, slots=True)
class Arrival:
    time: float
    job_id: str
    spec: JobSpec


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    nodes: tuple[NodeInfo, ...]
    arrivals: tuple[Arrival, ...]          # sorted by time
    quotas: QueueTree = field(default_factory=QueueTree)
    note: str = ""                         # how it was made: source, scaling, seed
    # Pools' declared topology levels, top down (a ``PoolTopologySet`` each at time 0);
    # a pool not named keeps ``core.topology.DEFAULT_LEVELS``.
    pool_levels: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # The node label keys, top down, the runs measure gangs' placements by
    # (``gpusched.sim.topology``); none: not measured.
    topology: tuple[str, ...] = ()


def gpu_node(name: str, model: str, gpus: int, cpu_milli: int, memory_mib: int, pool: str = "default") -> NodeInfo:
    memory = CATALOG[model].memory_mib if model in CATALOG else 0
    return NodeInfo(name=name, pool=pool, cpu_milli=cpu_milli, memory_mib=memory_mib, simulated=True,
                    gpus=tuple(GpuInfo(i, f"{name}-gpu{i}", model, memory) for i in range(gpus)))


# openb has no teams: its QoS classes stand in for them, with a matching priority class.
_OPENB_QOS = {
    "LS": ("ls", "production-inference", JobKind.INFERENCE),
    "Guaranteed": ("guaranteed", "training-high", JobKind.TRAINING),
    "Burstable": ("burstable", "training", JobKind.TRAINING),
    "BE": ("be", "best-effort", JobKind.TRAINING),
}


def openb_workload(pods: str = "default", time_compression: float = 1.0, node_stride: int = 1,
                   trace_dir: Path = traces.TRACE_DIR) -> Workload:
    """Tasks arrive at ``creation_time / time_compression`` (shifted to start at 0) and run
    for their lifetime, unscaled; the cluster is every ``node_stride``-th node of the list
    (which keeps its mix of models). Both only raise the offered load: at the trace's own
    pace its tasks hold about 1 % of the cluster's GPUs, and 90 % of their GPU-seconds
    come from 81 tasks that live longer than a day."""
    arrivals = []
    with open(trace_dir / f"openb_pod_list_{pods}.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    if rows and "creation_time" not in rows[0]:
        raise ValueError(f"openb_pod_list_{pods}.csv has no creation/deletion times (only the static "
                         "benchmark can use it)")
    start = min(int(r["creation_time"]) for r in rows)
    for r in rows:
        team, priority, kind = _OPENB_QOS.get(r["qos"], ("other", "training", JobKind.TRAINING))
        lifetime = float(int(r["deletion_time"]) - int(r["creation_time"]))
        spec = JobSpec(name=r["name"], team=team, priority_class=priority, kind=kind,
                       resources=traces.task_resources(r), max_runtime_s=lifetime,
                       simulated_duration_s=lifetime)
        arrivals.append(Arrival((int(r["creation_time"]) - start) / time_compression, r["name"], spec))
    arrivals.sort(key=lambda a: (a.time, a.job_id))
    nodes = tuple(traces.load_nodes(trace_dir)[::node_stride])
    note = (f"openb_pod_list_{pods}.csv, arrivals compressed {time_compression:g}x, lifetimes unscaled, "
            f"on every {node_stride}th node of openb_node_list_gpu_node.csv ({len(nodes)} nodes, "
            f"{sum(len(n.gpus) for n in nodes)} GPUs); teams = QoS classes, no quotas")
    return Workload(f"openb-{pods}", nodes, tuple(arrivals), QueueTree(), note)
