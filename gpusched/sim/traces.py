"""The Alibaba "openb" GPU cluster trace (cluster-trace-gpu-v2023) as gpusched nodes and jobs.

Nodes (``openb_node_list_gpu_node.csv``: ``sn,cpu_milli,memory_mib,gpu,model``) become
``NodeInfo`` with the trace's model names (all in ``gpusched.core.catalog``). Tasks
(``openb_pod_list_<name>.csv``) become one-worker ``JobSpec``: ``num_gpu == 1`` with
``gpu_milli < 1000`` is a GPU share, any other GPU task takes ``num_gpu`` whole GPUs,
``num_gpu == 0`` is CPU-only; ``gpu_spec`` (``|``-separated, may be absent) restricts
the GPU models. Only the first five columns and ``gpu_spec`` are read (multigpu20 has
only the five). The trace folder is ``$GPUSCHED_TRACE_DIR``, else ``shared/traces/alibaba-v2023``
in the folder that holds the checkout or in any folder above it.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from gpusched.config import process_settings
from gpusched.core.catalog import CATALOG, is_mig_capable
from gpusched.core.model import GpuInfo, JobSpec, NodeInfo, WorkerResources

_SHARED = Path("shared") / "traces" / "alibaba-v2023"


def _shared_traces() -> Path:
    """The first ``shared/traces/alibaba-v2023`` found beside the checkout or above it
    (the one beside the checkout when none is)."""
    above = Path(__file__).resolve().parents[2].parents
    return next((folder / _SHARED for folder in above if (folder / _SHARED).is_dir()), above[0] / _SHARED)


TRACE_DIR = Path(process_settings().trace_dir or _shared_traces())
NODE_LIST = "openb_node_list_gpu_node.csv"
POD_LISTS = ("default", "cpu050", "gpushare40", "multigpu20", "gpuspec10")
POOL = "default"
TEAM = "openb"


@dataclass(frozen=True, slots=True)
class Task:
    name: str
    resources: WorkerResources

    @property
    def gpu_milli(self) -> int:
        return self.resources.milli

    def spec(self, name: str) -> JobSpec:
        return JobSpec(name=name, team=TEAM, pool=POOL, resources=self.resources)


def load_nodes(trace_dir: Path = TRACE_DIR) -> list[NodeInfo]:
    nodes = []
    with open(trace_dir / NODE_LIST, newline="") as f:
        for row in csv.DictReader(f):
            model = row["model"]
            memory = CATALOG[model].memory_mib if model in CATALOG else 0
            gpus = tuple(GpuInfo(i, f"{row['sn']}-gpu{i}", model, memory, is_mig_capable(model))
                         for i in range(int(row["gpu"])))
            nodes.append(NodeInfo(name=row["sn"], pool=POOL, cpu_milli=int(row["cpu_milli"]),
                                  memory_mib=int(row["memory_mib"]), gpus=gpus, simulated=True))
    return nodes


def load_tasks(pod_list: str, trace_dir: Path = TRACE_DIR) -> list[Task]:
    tasks = []
    with open(trace_dir / f"openb_pod_list_{pod_list}.csv", newline="") as f:
        for row in csv.DictReader(f):
            tasks.append(Task(row["name"], task_resources(row)))
    return tasks


def task_resources(row: dict[str, str]) -> WorkerResources:
    gpus, milli = int(row["num_gpu"]), int(row["gpu_milli"] or 0)
    models = tuple(m for m in (row.get("gpu_spec") or "").split("|") if m)
    common = dict(cpu_milli=int(row["cpu_milli"]), memory_mib=int(row["memory_mib"]), gpu_models=models)
    if gpus == 1 and 0 < milli < 1000:
        return WorkerResources(gpu_milli=milli, **common)
    return WorkerResources(gpus=gpus, **common)
