"""What a dynamic run records, and the figures it is judged by.

* GPU allocation: allocated GPU milli / capacity, time-weighted over the arrival window
  (first to last arrival: after it the cluster only drains), and over the time the
  cluster was *saturated*: the GPUs held plus those waiting jobs ask for reach the
  capacity (``gpu_allocation_saturated``: how much of the cluster a policy keeps busy
  when there is enough work to fill it).
* Queueing delay (start - submit) and job completion time (end - submit): mean, p50, p99
  over the jobs that ran, and the queueing delay of large jobs (8 GPUs or more: a whole
  node, or a gang) apart, since they are the jobs that starve; jobs that never ran are
  counted apart.
* Waits by job size (``SIZES``: 1 GPU or a share, 2-4 GPUs, 5-8 GPUs on one node, gangs of
  more than one worker): the p99 and the worst wait of the jobs that ran, and how many
  never ran. Starvation shows in the worst waits of the big ones, not in means.
* Preemptions and the GPU-hours they lost (GPU time of attempts that did not finish), by
  reason and by the priority classes of victim and beneficiary (``preemptions_by``), with
  how many struck a job already preempted before.
* Waits by priority class (``classes``), and of the jobs that arrived within their team's
  guarantee (``within_guarantee_wait_s``): what the preemptor is for is that the higher
  classes and guaranteed work wait less.
* Fairness: Jain's index over the teams that have jobs waiting, of each team's allocation
  divided by its entitlement (its guarantee, or an equal split without quotas), averaged
  over the time at least two teams wait. 1.0: every waiting team gets the same fraction
  of what it is entitled to; 1/n: one team gets everything.
* Fragmentation: the fraction of free GPU milli on nodes that cannot host the workload's
  median task (by GPU request, with its CPU and memory), i.e. idle GPUs stranded for the
  typical job; averaged over probes in the arrival window.
* Topology (runs with ``--topology``, ``gpusched.sim.topology.compactness``): of the
  multi-node gangs' placements, the share within one block and within one rack; their
  waits by size in GPUs, and every other job's.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from gpusched.core.model import WorkerResources
from gpusched.core.state import ClusterState
from gpusched.policies.gpu_fit import fits_node, pick_gpus
from gpusched.sim.topology import compactness

LARGE_MILLI = 8000   # a job of a whole 8-GPU node or more
# Job sizes the waits are broken down by: (name, GPU milli at most, gangs of several workers).
SIZES = (("1", 1000, False), ("2-4", 4000, False), ("8", 8000, False), ("multi-node", None, True))


def size_of(milli: int, workers: int) -> str:
    """The ``SIZES`` bucket of a job of ``milli`` GPU milli in all and ``workers`` workers."""
    if workers > 1:
        return "multi-node"
    return next((name for name, most, _ in SIZES if most is not None and milli <= most), "multi-node")


@dataclass(frozen=True, slots=True)
class Sample:
    """The cluster right after one step of the loop (events applied, cycle run)."""

    time: float
    allocated_milli: int
    team_milli: tuple[int, ...]        # aligned with SimResult.teams
    backlogged: tuple[bool, ...]       # the team has jobs waiting
    pending: int
    pending_milli: int                 # GPU milli the waiting jobs ask for


@dataclass(frozen=True, slots=True)
class JobRecord:
    job_id: str
    team: str
    milli: int
    workers: int
    submitted_at: float
    started_at: float | None           # None: never ran
    ended_at: float | None
    preemptions: int = 0               # attempts preempted
    lost_gpu_s: float = 0.0            # GPU-seconds of those attempts
    priority_class: str = ""
    within_guarantee: bool = False     # its team held less than its guarantee with it, on arrival


@dataclass(frozen=True, slots=True)
class PreemptionRecord:
    """One victim of one preemption."""

    time: float
    reason: str                        # "priority" | "reclaim" | "defragmentation"
    victim_class: str
    for_class: str                     # the beneficiary's priority class
    lost_gpu_s: float                  # the victim's work since its last checkpoint, on all its GPUs
    earlier: int                       # times the victim was preempted before


@dataclass
class SimResult:
    workload: str
    label: str
    capacity_milli: int
    teams: tuple[str, ...]
    entitled_milli: tuple[float, ...]  # each team's entitlement, for Jain's index
    samples: list[Sample] = field(default_factory=list)
    fragmentation: list[tuple[float, float, float]] = field(default_factory=list)  # (t, ratio, stranded milli)
    jobs: list[JobRecord] = field(default_factory=list)
    preempted: list[PreemptionRecord] = field(default_factory=list)
    cycles: int = 0
    backfilled: int = 0
    rejected: int = 0
    wall_s: float = 0.0
    services: dict = field(default_factory=dict)   # ``gpusched.sim.serving``'s figures, when services ran
    # With a topology (``gpusched.sim.topology``): the label keys measured, top down; the
    # pools' declared levels (none: the default); each node's labels at those levels; the
    # multi-node gangs' ids; and every placement of one.
    topology_levels: tuple[str, ...] = ()
    pool_levels: dict = field(default_factory=dict)
    domain_paths: dict = field(default_factory=dict)
    gangs: set = field(default_factory=set)
    gang_placements: list = field(default_factory=list)


class FragmentationProbe:
    def __init__(self, typical: WorkerResources) -> None:
        self.typical = replace(typical, gpu_models=())

    @classmethod
    def for_workload(cls, workload) -> FragmentationProbe:
        gpu_tasks = sorted((a.spec.resources for a in workload.arrivals if a.spec.resources.milli),
                           key=lambda r: (r.milli, r.cpu_milli, r.memory_mib))
        return cls(gpu_tasks[len(gpu_tasks) // 2] if gpu_tasks else WorkerResources(gpus=1))

    def measure(self, state: ClusterState) -> tuple[float, float]:
        """(fraction of free GPU milli that is stranded, stranded GPU milli)."""
        free = stranded = 0
        for node in state.nodes.values():
            if not node.schedulable:
                continue
            node_free = sum(g.free_milli for g in node.gpus if g.healthy)
            free += node_free
            if node_free and not (fits_node(node, self.typical) and pick_gpus(node, self.typical) is not None):
                stranded += node_free
        return (stranded / free if free else 0.0), float(stranded)


def _stats(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"mean": None, "p50": None, "p99": None}
    a = np.asarray(values, dtype=float)
    return {"mean": float(a.mean()), "p50": float(np.percentile(a, 50)), "p99": float(np.percentile(a, 99))}


def _durations(samples: list[Sample], end: float) -> np.ndarray:
    """How long each sample held: until the next one, the last until ``end``."""
    t = np.array([s.time for s in samples] + [end])
    return np.clip(np.diff(t), 0, None)


def summarize(result: SimResult) -> dict:
    ran = [j for j in result.jobs if j.started_at is not None]
    never = [j for j in result.jobs if j.started_at is None]
    large = [j for j in ran if j.milli >= LARGE_MILLI]
    samples = result.samples
    first = min((j.submitted_at for j in result.jobs), default=0.0)
    last = max((j.submitted_at for j in result.jobs), default=0.0)
    window = [s for s in samples if first <= s.time <= last]
    summary = {
        "workload": result.workload, "config": result.label, "jobs": len(result.jobs),
        "ran": len(ran), "never_ran": len(never),
        "never_ran_by_team": {t: sum(1 for j in never if j.team == t) for t in result.teams
                              if any(j.team == t for j in never)},
        "gpu_allocation": _allocation(window, last, result.capacity_milli),
        "gpu_allocation_saturated": _allocation_saturated(samples, result.capacity_milli),
        "queueing_delay_s": _stats([j.started_at - j.submitted_at for j in ran]),
        "large_delay_s": {**_stats([j.started_at - j.submitted_at for j in large]),
                          "max": max((j.started_at - j.submitted_at for j in large), default=None)},
        "jct_s": _stats([j.ended_at - j.submitted_at for j in ran]),
        "makespan_s": max((j.ended_at for j in ran), default=0.0) - first,
        "jain_backlogged": _jain(samples, result.entitled_milli, samples[-1].time if samples else 0.0),
        "fragmentation": _mean([r for t, r, _ in result.fragmentation if first <= t <= last]),
        "stranded_gpus": _mean([s / 1000 for t, _, s in result.fragmentation if first <= t <= last]),
        "waits_by_size": _by_size(result.jobs),
        "preemptions": sum(j.preemptions for j in result.jobs),
        "gpu_hours_lost": sum(j.lost_gpu_s for j in result.jobs) / 3600,
        "capacity_gpu_hours": result.capacity_milli / 1000 * (last - first) / 3600,   # over the arrivals
        "preemptions_by": _preemptions_by(result.preempted),
        "classes": {c: _stats([j.started_at - j.submitted_at for j in ran if j.priority_class == c])
                    for c in sorted({j.priority_class for j in result.jobs})},
        "within_guarantee_wait_s": _stats([j.started_at - j.submitted_at for j in ran if j.within_guarantee]),
        "cycles": result.cycles, "backfilled": result.backfilled, "rejected": result.rejected,
        "wall_s": result.wall_s,
        "teams": {t: _team(result, i, ran, window, last) for i, t in enumerate(result.teams)},
    }
    if result.services:
        summary["services"] = result.services
    if result.topology_levels:
        summary["topology"] = {
            "pool_levels": {p: list(lv) for p, lv in sorted(result.pool_levels.items())},
            **compactness(result.gang_placements, result.domain_paths, result.topology_levels, result.jobs,
                          result.gangs)}
    return summary


def _preemptions_by(records: list[PreemptionRecord]) -> list[dict]:
    """Victims by (reason, victim's class, beneficiary's class): how many, the GPU-hours
    they lost, the median work lost per victim, and how many had been preempted before."""
    groups: dict[tuple[str, str, str], list[PreemptionRecord]] = {}
    for r in records:
        groups.setdefault((r.reason, r.victim_class, r.for_class), []).append(r)
    rows = [{"reason": reason, "victim_class": victim, "for_class": for_class, "victims": len(rs),
             "gpu_hours_lost": sum(r.lost_gpu_s for r in rs) / 3600,
             "median_lost_gpu_s": float(np.median([r.lost_gpu_s for r in rs])),
             "again": sum(1 for r in rs if r.earlier)}
            for (reason, victim, for_class), rs in groups.items()]
    return sorted(rows, key=lambda row: -row["gpu_hours_lost"])


def _by_size(jobs: list[JobRecord]) -> dict[str, dict]:
    """Per ``SIZES`` bucket: jobs, p99 and worst wait of those that ran, and never ran."""
    out: dict[str, dict] = {}
    for name, _, _ in SIZES:
        mine = [j for j in jobs if size_of(j.milli, j.workers) == name]
        waits = [j.started_at - j.submitted_at for j in mine if j.started_at is not None]
        out[name] = {"jobs": len(mine), "p99": _stats(waits)["p99"], "max": max(waits, default=None),
                     "never_ran": sum(1 for j in mine if j.started_at is None)}
    return out


def _mean(values: list[float]) -> float | None:
    return float(np.mean(values)) if values else None


def _allocation(window: list[Sample], end: float, capacity: int) -> float | None:
    if not window:
        return None
    dt = _durations(window, end)
    if dt.sum() == 0:
        return window[-1].allocated_milli / capacity
    return float(np.dot(dt, [s.allocated_milli for s in window]) / dt.sum() / capacity)


def _allocation_saturated(samples: list[Sample], capacity: int) -> float | None:
    if not samples:
        return None
    dt = _durations(samples, samples[-1].time)
    saturated = dt * np.array([s.allocated_milli + s.pending_milli >= capacity for s in samples])
    if not saturated.sum():
        return None
    return float(np.dot(saturated, [s.allocated_milli for s in samples]) / saturated.sum() / capacity)


def _jain(samples: list[Sample], entitled: tuple[float, ...], end: float) -> float | None:
    dt = _durations(samples, end) if samples else np.array([])
    total = weighted = 0.0
    for s, d in zip(samples, dt):
        x = [m / e for m, e, b in zip(s.team_milli, entitled, s.backlogged) if b and e > 0]
        if len(x) < 2 or d == 0 or not any(x):
            continue
        weighted += d * sum(x) ** 2 / (len(x) * sum(v * v for v in x))
        total += d
    return weighted / total if total else None


def _team(result: SimResult, index: int, ran: list[JobRecord], window: list[Sample], end: float) -> dict:
    """A team's jobs, waits, and GPUs held on average over the arrival window."""
    team = result.teams[index]
    waits = [j.started_at - j.submitted_at for j in ran if j.team == team]
    dt = _durations(window, end) if window else np.array([])
    held = float(np.dot(dt, [s.team_milli[index] for s in window]) / dt.sum()) if dt.sum() else 0.0
    return {"jobs": sum(1 for j in result.jobs if j.team == team), "wait_s": _stats(waits),
            "mean_gpus": held / 1000, "entitled_gpus": result.entitled_milli[index] / 1000}
