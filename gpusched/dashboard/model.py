"""What the dashboard keeps and derives, with no gRPC or HTTP: the GPU states of the node
grid, a pool's fragmentation, the samples of its charts and the job events it has seen."""
from __future__ import annotations

import threading
import time
from collections import defaultdict, deque
from dataclasses import dataclass
from typing import Iterable

from gpusched.client import seconds
from gpusched.v1 import types_pb2

MIG_SLICES = 8


def gpu_milli_used(gpu: types_pb2.Gpu) -> int:
    """Allocated milli of one GPU, as the API counts it (``Gpu.allocated_milli``: a MIG
    slice its compute sevenths, as a job's usage)."""
    return gpu.allocated_milli


def gpu_state(gpu: types_pb2.Gpu) -> str:
    """One word per GPU cell: faulty, mig (slices in use), share (part used), whole, free."""
    if not gpu.healthy:
        return "faulty"
    if gpu.mig_slices_used:
        return "mig"
    if 0 < gpu.used_milli < 1000:
        return "share"
    return "whole" if gpu.used_milli >= 1000 else "free"


def schedulable(nodes: Iterable[types_pb2.Node]) -> list[types_pb2.Gpu]:
    """The GPUs work can be placed on: healthy ones of ready nodes."""
    return [g for n in nodes if n.status == types_pb2.NODE_STATUS_READY for g in n.gpus if g.healthy]


def fragmentation(nodes: Iterable[types_pb2.Node]) -> float:
    """The share of free GPU capacity that lies on partly used GPUs, so that no whole-GPU
    job can use it (0: every free GPU is whole; 0 when nothing is free)."""
    free = stranded = 0
    for gpu in schedulable(nodes):
        left = max(0, 1000 - gpu_milli_used(gpu))
        free += left
        if left < 1000:
            stranded += left
    return stranded / free if free else 0.0


def allocation(nodes: Iterable[types_pb2.Node]) -> float:
    """Allocated GPU capacity over the capacity of the schedulable GPUs."""
    gpus = schedulable(nodes)
    return sum(min(1000, gpu_milli_used(g)) for g in gpus) / (1000 * len(gpus)) if gpus else 0.0


@dataclass(frozen=True)
class Sample:
    t: float
    allocation: float
    fragmentation: float


class History:
    """The last ``size`` samples of each pool, taken while the dashboard runs (thread-safe:
    the sampler writes, the HTTP threads read)."""

    def __init__(self, size: int = 720) -> None:
        self._size = size
        self._pools: dict[str, deque[Sample]] = {}
        self._lock = threading.Lock()

    def record(self, nodes: list[types_pb2.Node], t: float | None = None) -> None:
        by_pool: dict[str, list[types_pb2.Node]] = defaultdict(list)
        for node in nodes:
            by_pool[node.info.pool].append(node)
        now = time.time() if t is None else t
        with self._lock:
            for pool, members in by_pool.items():
                samples = self._pools.setdefault(pool, deque(maxlen=self._size))
                samples.append(Sample(now, allocation(members), fragmentation(members)))

    def pools(self) -> dict[str, list[Sample]]:
        with self._lock:
            return {pool: list(samples) for pool, samples in sorted(self._pools.items())}


@dataclass(frozen=True)
class SeenEvent:
    t: float           # when the dashboard received it
    event_type: str
    phase: int
    reason: str
    offset: int


class EventBook:
    """The events of each job that the dashboard's watch has received since it started
    (the API serves a job's current state, not its history), the last ``per_job`` of each."""

    def __init__(self, per_job: int = 50, jobs: int = 10_000) -> None:
        self._per_job, self._jobs = per_job, jobs
        self._events: dict[str, deque[SeenEvent]] = {}
        self._lock = threading.Lock()

    def record(self, job: types_pb2.Job, event_type: str, offset: int, t: float | None = None) -> None:
        # a pending reason's event shows that reason, every other the job's own
        reason = job.pending.summary if event_type == "JobPendingReason" else job.reason
        seen = SeenEvent(time.time() if t is None else t, event_type, job.phase, reason, offset)
        with self._lock:
            if job.job_id not in self._events and len(self._events) >= self._jobs:
                self._events.pop(next(iter(self._events)))   # the job first seen longest ago
            self._events.setdefault(job.job_id, deque(maxlen=self._per_job)).append(seen)

    def of(self, job_id: str) -> list[SeenEvent]:
        with self._lock:
            return list(self._events.get(job_id, ()))


@dataclass(frozen=True)
class Step:
    t: float
    label: str
    detail: str = ""


def timeline(job: types_pb2.Job, seen: list[SeenEvent]) -> list[Step]:
    """The job's times from the API's fields, and the events seen, in time order."""
    phase = types_pb2.JobPhase.Name
    steps = [Step(seconds(t), label) for t, label in ((job.submitted_at, "Submitted"), (job.placed_at, "Placed"),
                                                      (job.started_at, "Started"),
                                                      (job.ended_at,
                                                       f"Ended: {phase(job.phase).removeprefix('JOB_PHASE_')}"))
             if seconds(t)]
    steps += [Step(e.t, e.event_type, f"{phase(e.phase).removeprefix('JOB_PHASE_')}"
                                      f"{' - ' + e.reason if e.reason else ''}"
                                      f"{f' (offset {e.offset})' if e.offset >= 0 else ''}")
              for e in seen if e.event_type != "Current"]
    return sorted(steps, key=lambda s: s.t)
