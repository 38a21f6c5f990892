"""A seeded multi-team workload: training gangs, inference services and small jobs.

Teams sit in orgs with quotas (``QUOTAS``). Each team draws jobs from its own mix until
the GPU-seconds it submits reach its share of the offered load; arrival times are uniform
over the horizon, so each team is a Poisson-like stream. Durations are lognormal (heavy
tailed: the p99 is tens of times the median). Users over-estimate runtimes, as they do:
``max_runtime_s`` is the true duration times a factor in [1, 3). One team (``batch``)
also floods the queue once, which is what fairness and aging are for.

All randomness comes from one ``random.Random(seed)``: same seed, same workload.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

from gpusched.core.model import JobKind, JobSpec, WorkerResources
from gpusched.policies.queueing.quota import QueueTree
from gpusched.sim.workload import Arrival, Workload, gpu_node

QUOTAS = QueueTree.from_dict({"orgs": {
    "research": {"weight": 1.0, "teams": {
        "llm": {"guaranteed_gpus": 192, "limit_gpus": 448, "weight": 2.0},
        "vision": {"guaranteed_gpus": 64, "limit_gpus": 256},
    }},
    "product": {"weight": 1.0, "teams": {
        "search": {"guaranteed_gpus": 96, "limit_gpus": 192},
        "ads": {"guaranteed_gpus": 64, "limit_gpus": 192},
    }},
    "platform": {"limit_gpus": 160, "teams": {
        "batch": {"guaranteed_gpus": 32, "limit_gpus": 160},
    }},
}})


@dataclass(frozen=True, slots=True)
class JobMix:
    """One kind of job: ``sizes`` are (total GPUs, probability), split into 8-GPU workers
    when larger than a node; or a ``gpu_milli`` share of one GPU."""

    sizes: tuple[tuple[int, float], ...] = ((1, 1.0),)
    gpu_milli: int = 0
    median_s: float = 3600.0
    sigma: float = 1.2
    priority_class: str = "training"
    kind: JobKind = JobKind.TRAINING
    models: tuple[str, ...] = ()


INFERENCE_MODELS = ("L40S-48GB", "H100-80GB")
TRAIN_BIG = JobMix(((8, 0.3), (16, 0.3), (32, 0.25), (64, 0.15)), median_s=4 * 3600, sigma=1.0,
                   priority_class="training-high")
TRAIN_MID = JobMix(((1, 0.3), (2, 0.25), (4, 0.25), (8, 0.15), (16, 0.05)), median_s=2 * 3600)
SERVE = JobMix(median_s=8 * 3600, sigma=0.8, priority_class="production-inference",
               kind=JobKind.INFERENCE, models=INFERENCE_MODELS)
SERVE_SHARED = JobMix(gpu_milli=500, median_s=6 * 3600, sigma=0.8, priority_class="production-inference",
                      kind=JobKind.INFERENCE, models=INFERENCE_MODELS)
DEV = JobMix(median_s=1800, sigma=1.0, priority_class="best-effort")
BATCH = JobMix(median_s=3600, sigma=1.0, priority_class="best-effort")

# team -> (share of the offered load, in GPU-seconds of the horizon; its mix)
TEAMS: dict[str, tuple[float, tuple[tuple[JobMix, float], ...]]] = {
    "llm": (0.45, ((TRAIN_BIG, 0.7), (TRAIN_MID, 0.3))),
    "vision": (0.20, ((TRAIN_MID, 0.8), (DEV, 0.2))),
    "search": (0.15, ((SERVE, 0.6), (SERVE_SHARED, 0.4))),
    "ads": (0.15, ((SERVE_SHARED, 0.5), (TRAIN_MID, 0.5))),
    "batch": (0.20, ((BATCH, 1.0),)),
}
MAX_DURATION_S = 5 * 86400.0
GPU_NODE = 8


def synthetic_cluster(h100_nodes: int = 64, l40s_nodes: int = 16):
    h100 = [gpu_node(f"h100-{i:03d}", "H100-80GB", 8, 128_000, 1_048_576) for i in range(h100_nodes)]
    l40s = [gpu_node(f"l40s-{i:03d}", "L40S-48GB", 4, 64_000, 393_216) for i in range(l40s_nodes)]
    return tuple(h100 + l40s)


def synthetic_workload(seed: int = 0, horizon_s: float = 2 * 86400.0, load: float = 1.0,
                       h100_nodes: int = 64, l40s_nodes: int = 16, flood_jobs: int = 300,
                       worker_gpus: int = GPU_NODE) -> Workload:
    """``load`` scales every team's share (the shares sum to 1.15); a job larger than
    ``worker_gpus`` is a gang of workers of that many GPUs (a whole H100 node by default)."""
    rng = random.Random(seed)
    nodes = synthetic_cluster(h100_nodes, l40s_nodes)
    capacity_gpus = sum(len(n.gpus) for n in nodes)
    arrivals: list[Arrival] = []
    for team, (share, mix) in TEAMS.items():
        budget = share * load * capacity_gpus * horizon_s
        n = 0
        while budget > 0:
            kind = rng.choices([m for m, _ in mix], weights=[w for _, w in mix])[0]
            spec = _draw(rng, kind, team, f"{team}-{n:05d}", worker_gpus)
            budget -= spec.total_milli / 1000 * spec.simulated_duration_s
            arrivals.append(Arrival(rng.uniform(0, horizon_s), spec.name, spec))
            n += 1
    flood_at = 0.3 * horizon_s
    for i in range(flood_jobs):
        spec = _draw(rng, BATCH, "batch", f"batch-flood-{i:04d}", worker_gpus)
        arrivals.append(Arrival(flood_at, spec.name, spec))
    arrivals.sort(key=lambda a: (a.time, a.job_id))
    note = (f"synthetic seed={seed} horizon={horizon_s:g}s load={load:g}x1.15 of {capacity_gpus} GPUs "
            f"({h100_nodes}x8 H100 + {l40s_nodes}x4 L40S), flood of {flood_jobs} batch jobs at {flood_at:g}s"
            + (f", gang workers of {worker_gpus} GPUs" if worker_gpus != GPU_NODE else ""))
    name = f"synthetic-s{seed}" + (f"-w{worker_gpus}" if worker_gpus != GPU_NODE else "")
    return Workload(name, nodes, tuple(arrivals), QUOTAS, note)


def _draw(rng: random.Random, mix: JobMix, team: str, name: str, worker_gpus: int = GPU_NODE) -> JobSpec:
    gpus = rng.choices([g for g, _ in mix.sizes], weights=[p for _, p in mix.sizes])[0]
    duration = min(MAX_DURATION_S, mix.median_s * math.exp(mix.sigma * rng.gauss(0.0, 1.0)))
    estimate = math.ceil(duration * rng.uniform(1.0, 3.0))
    if mix.gpu_milli:
        workers, res = 1, WorkerResources(gpu_milli=mix.gpu_milli, cpu_milli=4000, memory_mib=16_384,
                                          gpu_models=mix.models)
    else:
        per_worker = min(gpus, worker_gpus)
        workers = max(1, gpus // worker_gpus)
        res = WorkerResources(gpus=per_worker, cpu_milli=12_000 * per_worker, memory_mib=65_536 * per_worker,
                              gpu_models=mix.models)
    return JobSpec(name=name, team=team, org=QUOTAS.org_of(team), priority_class=mix.priority_class,
                   kind=mix.kind, workers=workers, resources=res, max_runtime_s=estimate,
                   simulated_duration_s=duration)
