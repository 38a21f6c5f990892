"""Inference services in the dynamic simulator: a diurnal request curve per service, its
replicas' start-up, and the figures services are judged by.

A service's requests per second follow a day (``period_s``): a sinusoid from
``peak_rps / peak_to_trough`` at the trough to ``peak_rps`` at the peak, times
``1 + noise x N(0, 1)`` drawn from the seeded generator at each autoscaler sync (every
``sync_s``, the HPA's 15 s), so a run is the same for a seed. At each sync every ready
replica measures ``requests / ready replicas`` requests a second (``ReplicaLoad``), and
the preemptor's ``autoscale`` action (``policies.actions``: the HPA's rule,
``policies.autoscaling.recommend``) answers the counts, which go to the log as
``ServiceScaled``. A replica is ready ``startup_s`` after it starts running, when the
simulator reports ``ReplicaReadiness`` as its node-agent would.

Figures (``ServiceTracker.summary``):

* **availability**: the fraction of simulated minutes (sampled at each whole minute of
  the service window) in which a service's ready replicas reached what its load needs,
  ``ceil(requests / capacity_rps)`` within ``min_replicas..max_replicas``; also
  ``availability_desired``: ready >= the desired count.
* **scale-up latency**: from a ``ServiceScaled`` that raised the desired count to the
  moment the ready count reached each added replica (p50, p99, max); added replicas a
  later scale-down dropped before they were ready are counted apart (``dropped``).
* **training GPU-hours taken**: GPU-hours of training work lost to preemptions whose
  beneficiary was a replica, and the GPU-hours training jobs held over the service window
  (beside the same figures of the static split, where training never meets a replica).

``static_split``: the cluster's nodes split in two pools, an inference pool sized for the
peak (the sum of the services' ``max_replicas`` GPUs) and the training pool (the rest).
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, replace

import numpy as np

from gpusched.core.model import Autoscaling, JobKind, JobSpec, NodeInfo, ScalingMetric, ServiceSpec, WorkerResources

INFERENCE_POOL = "inference"


@dataclass(frozen=True, slots=True)
class DiurnalService:
    spec: ServiceSpec
    capacity_rps: float        # requests a second one replica serves at the target
    peak_rps: float
    peak_to_trough: float      # peak / trough of the curve
    period_s: float = 86_400.0
    phase_s: float = 0.0       # the trough is at phase_s (and every period after)
    noise: float = 0.05

    def mean_rps(self, t: float) -> float:
        """The curve without noise at ``t``."""
        trough = self.peak_rps / self.peak_to_trough
        rise = (1 - math.cos(2 * math.pi * (t - self.phase_s) / self.period_s)) / 2
        return trough + (self.peak_rps - trough) * rise

    def needed(self, rps: float) -> int:
        """Replicas the load needs: ``ceil(rps / capacity)`` within the service's bounds."""
        spec = self.spec
        count = max(spec.min_replicas, math.ceil(rps / self.capacity_rps - 1e-9))
        return min(spec.max_replicas, count) if spec.max_replicas else count


@dataclass(frozen=True, slots=True)
class ServiceLoads:
    """The services of a run and how they are simulated."""

    services: tuple[DiurnalService, ...]
    seed: int = 0
    end_s: float = 86_400.0    # the services are deleted then (the training jobs drain after)
    startup_s: float = 60.0    # running to ready
    sync_s: float = 15.0       # the autoscaler's period
    split: str = "shared"      # "shared": one cluster; "static": see ``static_split``

    @property
    def peak_gpus(self) -> float:
        return sum(s.spec.max_replicas * s.spec.template.total_milli / 1000 for s in self.services)


def diurnal_services(count: int, seed: int, end_s: float, period_s: float = 86_400.0,
                     gpu_milli: int = 1000, capacity_rps: float = 10.0, max_replicas: int = 16,
                     peak_to_trough: float = 4.0, noise: float = 0.05, startup_s: float = 60.0,
                     split: str = "shared", team: str = "serving") -> ServiceLoads:
    """``count`` services, each of replicas of ``gpu_milli`` GPU milli serving
    ``capacity_rps``, autoscaled on requests a second (target = the capacity) between 1
    and ``max_replicas``; each one's peak needs 50-90 % of its maximum (drawn from the
    seed) and its trough falls at a random time of the day."""
    rng = np.random.default_rng([seed, 7])
    resources = (WorkerResources(gpus=gpu_milli // 1000, cpu_milli=8000, memory_mib=32_768) if gpu_milli >= 1000
                 else WorkerResources(gpu_milli=gpu_milli, cpu_milli=4000, memory_mib=16_384))
    template = JobSpec(name="replica", team=team, kind=JobKind.INFERENCE, resources=resources,
                       command=("serve",), serve_port=True)
    services = []
    for i in range(count):
        spec = ServiceSpec(name=f"svc{i}", team=team, template=template, replicas=1, min_replicas=1,
                           max_replicas=max_replicas,
                           autoscaling=Autoscaling(ScalingMetric.REQUESTS_PER_SECOND, target=capacity_rps))
        peak = capacity_rps * max_replicas * float(rng.uniform(0.5, 0.9))
        services.append(DiurnalService(spec, capacity_rps, peak, peak_to_trough, period_s,
                                       float(rng.uniform(0, period_s)), noise))
    return ServiceLoads(tuple(services), seed, end_s, startup_s, split=split)


def static_split(nodes: tuple[NodeInfo, ...], loads: ServiceLoads) -> tuple[tuple[NodeInfo, ...], ServiceLoads]:
    """Nodes from the end of the list go to the inference pool until it holds the peak
    (every service at its ``max_replicas``); the services run there."""
    needed, held, out = loads.peak_gpus, 0.0, list(nodes)
    for i in range(len(out) - 1, -1, -1):
        if held >= needed:
            break
        if out[i].gpus:
            out[i] = replace(out[i], pool=INFERENCE_POOL)
            held += len(out[i].gpus)
    services = tuple(replace(s, spec=replace(s.spec, pool=INFERENCE_POOL)) for s in loads.services)
    return tuple(out), replace(loads, services=services)


def _stats(values: list[float]) -> dict:
    if not values:
        return {"n": 0, "p50": None, "p99": None, "max": None}
    a = np.asarray(values, dtype=float)
    return {"n": len(values), "p50": float(np.percentile(a, 50)), "p99": float(np.percentile(a, 99)),
            "max": float(a.max())}


class ServiceTracker:
    """The services' clock (syncs, readiness times) and what they measured."""

    def __init__(self, loads: ServiceLoads) -> None:
        self.loads = loads
        self.by_name = {s.spec.name: s for s in loads.services}
        self._rng = np.random.default_rng([loads.seed, 11])
        self.next_sync = 0.0
        self.ticks = 0
        self.ready_at: list[tuple[float, int, str, int]] = []   # (time, seq, replica, attempt)
        self._seq = 0
        self.rps: dict[str, float] = {}
        # per service: [(time, rps, needed, desired, ready)] at each whole minute
        self.minutes: dict[str, list[tuple[float, float, int, int, int]]] = {n: [] for n in self.by_name}
        self.desired_series: dict[str, list[tuple[float, int]]] = {n: [] for n in self.by_name}
        self._waiting_up: dict[str, list[tuple[float, int]]] = {n: [] for n in self.by_name}   # (decided, ready count)
        self.latencies: dict[str, list[float]] = {n: [] for n in self.by_name}
        self.dropped: dict[str, int] = {n: 0 for n in self.by_name}
        self.scaled: dict[str, list[int]] = {n: [0, 0] for n in self.by_name}   # ups, downs
        self.lost_for_replicas_gpu_s = 0.0
        self.victims_for_replicas = 0
        self.training_gpu_s = 0.0       # held by training jobs within the service window
        self._last_step: tuple[float, int] | None = None
        self.deleted = False

    def next_time(self) -> float | None:
        times = [t for t, *_ in self.ready_at[:1]]
        if not self.deleted:
            times.append(min(self.next_sync, self.loads.end_s))
        return min(times) if times else None

    def end_due(self, now: float) -> bool:
        return not self.deleted and now >= self.loads.end_s

    def started(self, job_id: str, attempt: int, now: float) -> None:
        heapq.heappush(self.ready_at, (now + self.loads.startup_s, self._seq, job_id, attempt))
        self._seq += 1

    def due_ready(self, now: float) -> list[tuple[str, int]]:
        out = []
        while self.ready_at and self.ready_at[0][0] <= now:
            _, _, job_id, attempt = heapq.heappop(self.ready_at)
            out.append((job_id, attempt))
        return out

    def sync_due(self, now: float) -> bool:
        return not self.deleted and self.next_sync <= min(now, self.loads.end_s)

    def draw(self, now: float) -> dict[str, float]:
        """This sync's requests a second, per service (one draw each, in order)."""
        self.rps = {}
        for s in self.loads.services:
            factor = 1 + s.noise * float(self._rng.standard_normal())
            self.rps[s.spec.name] = max(0.0, s.mean_rps(now) * factor)
        return self.rps

    def record_minute(self, now: float, desired: dict[str, int], ready: dict[str, int]) -> None:
        if self.ticks % max(1, round(60 / self.loads.sync_s)) == 0:
            for name, s in self.by_name.items():
                rps = self.rps[name]
                self.minutes[name].append((now, rps, s.needed(rps), desired[name], ready[name]))
        self.ticks += 1
        self.next_sync = self.ticks * self.loads.sync_s

    def scaled_to(self, name: str, now: float, before: int, after: int) -> None:
        self.desired_series[name].append((now, after))
        waiting = self._waiting_up[name]
        if after > before:
            self.scaled[name][0] += 1
            waiting += [(now, count) for count in range(before + 1, after + 1)]
        elif after < before:
            self.scaled[name][1] += 1
            kept = [(t, c) for t, c in waiting if c <= after]
            self.dropped[name] += len(waiting) - len(kept)
            waiting[:] = kept

    def ready_count(self, name: str, now: float, ready: int) -> None:
        waiting = self._waiting_up[name]
        self.latencies[name] += [now - t for t, c in waiting if c <= ready]
        waiting[:] = [(t, c) for t, c in waiting if c > ready]

    def step(self, now: float, training_milli: int) -> None:
        """The training jobs' GPU milli held from ``now`` on (integrated up to ``end_s``)."""
        if self._last_step is not None:
            t0, milli = self._last_step
            self.training_gpu_s += max(0.0, min(now, self.loads.end_s) - t0) * milli / 1000
        self._last_step = (min(now, self.loads.end_s), training_milli)

    def summary(self) -> dict:
        per = {}
        all_minutes, all_latencies = [], []
        for name, s in self.by_name.items():
            minutes = self.minutes[name]
            all_minutes += minutes
            all_latencies += self.latencies[name]
            per[name] = {
                "peak_rps": s.peak_rps, "capacity_rps": s.capacity_rps, "max_replicas": s.spec.max_replicas,
                "minutes": len(minutes),
                "availability": _fraction(m[4] >= m[2] for m in minutes),
                "availability_desired": _fraction(m[4] >= m[3] for m in minutes),
                "desired_max": max((m[3] for m in minutes), default=0),
                "desired_min": min((m[3] for m in minutes), default=0),
                "scale_ups": self.scaled[name][0], "scale_downs": self.scaled[name][1],
                "scale_up_latency_s": _stats(self.latencies[name]), "dropped": self.dropped[name],
            }
        return {
            "services": len(self.by_name), "split": self.loads.split, "startup_s": self.loads.startup_s,
            "window_s": self.loads.end_s,
            "availability": _fraction(m[4] >= m[2] for m in all_minutes),
            "availability_desired": _fraction(m[4] >= m[3] for m in all_minutes),
            "scale_up_latency_s": _stats(all_latencies),
            "training_gpu_hours_lost_to_replicas": self.lost_for_replicas_gpu_s / 3600,
            "training_victims_of_replicas": self.victims_for_replicas,
            "training_gpu_hours_in_window": self.training_gpu_s / 3600,
            "per_service": per,
        }


def _fraction(flags) -> float | None:
    flags = list(flags)
    return sum(flags) / len(flags) if flags else None
