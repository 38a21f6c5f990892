"""GPU-hours allocated vs used, and jobs that hold GPUs idle: the utilization fold. Pure.

Two inputs, folded independently of the order they arrive in:

* Allocation, from the pool log: an attempt holds its GPUs from the event that placed it
  until the event after which it no longer does (``JobPhase.holds_gpus``), all its
  workers' milli (``observe`` is fed the reducer's folded job after each event).
* Usage records (``WorkerUsage``), from the node-agents: per worker, a window and the SM
  utilization of each of its GPUs.

Used GPU-hours of a worker are the integral over its samples of (window clipped to the
attempt's allocation, less the time another sample of the worker already stands for:
where windows overlap, the one ending first counts) x sum over its GPUs of (milli / 1000
x SM fraction). So used <= allocated by construction,
and overlapping or duplicated records (same ``record_id``) are never counted twice.
A GPU without an SM reading (MIG) counts as *unmeasured*, neither used nor idle.

Idle: a job is flagged when, for at least ``idle_after_s``, every measured sample of all
its workers read below ``idle_percent`` SM (consecutive samples in time order; one busy
sample of any worker ends the stretch). ``idle_now``: the stretch still runs at the last
sample and the attempt still holds its GPUs.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from gpusched.adapters.nodes.usage_records import WorkerUsage
from gpusched.core.state import JobState

DEFAULT_IDLE_PERCENT = 5.0
DEFAULT_IDLE_AFTER_S = 1800.0
_MS_PER_HOUR = 1000 * 3600   # milli-seconds of GPU (milli x s) per GPU-hour


@dataclass
class _Hold:
    team: str
    pool: str
    workers: int
    worker_milli: int
    start: float
    end: float | None = None
    name: str = ""


@dataclass(frozen=True, slots=True)
class _Sample:
    start: float
    end: float
    record_id: str
    used_milli: float        # sum over measured GPUs of milli x SM fraction
    unmeasured_milli: int    # sum of the milli of GPUs without an SM reading
    total_milli: int
    busy: bool | None        # any measured GPU at or above the idle threshold; None: none measured
    simulated: bool


@dataclass(frozen=True, slots=True)
class GpuHours:
    allocated: float = 0.0
    used: float = 0.0
    unmeasured: float = 0.0      # allocated time of GPUs NVML reports no SM use for (MIG)
    simulated: bool = False      # some samples came from a simulated node's model

    def __add__(self, other: GpuHours) -> GpuHours:
        return GpuHours(self.allocated + other.allocated, self.used + other.used,
                        self.unmeasured + other.unmeasured, self.simulated or other.simulated)

    @property
    def utilization(self) -> float | None:
        """Used over the allocated hours that were measured; None when none were."""
        measured = self.allocated - self.unmeasured
        return self.used / measured if measured > 0 else None


@dataclass(frozen=True, slots=True)
class JobUsage:
    job_id: str
    team: str
    pool: str
    hours: GpuHours
    idle_s: float        # longest stretch below the idle threshold
    idle: bool           # idle_s reached idle_after_s
    idle_now: bool       # ... and the stretch is still running
    name: str = ""       # the job's name (its spec's)


@dataclass(frozen=True)
class UtilizationReport:
    jobs: dict[str, JobUsage]
    teams: dict[str, GpuHours]
    pools: dict[str, GpuHours]
    total: GpuHours
    unattributed: int    # records of attempts (or workers) the log shows holding no GPUs

    @property
    def idle_jobs(self) -> list[JobUsage]:
        return [j for j in self.jobs.values() if j.idle]


@dataclass
class UtilizationLedger:
    idle_percent: float = DEFAULT_IDLE_PERCENT
    idle_after_s: float = DEFAULT_IDLE_AFTER_S
    _holds: dict[tuple[str, int], _Hold] = field(default_factory=dict)
    _open: dict[str, int] = field(default_factory=dict)   # job -> attempt holding now
    _samples: dict[tuple[str, int], dict[int, list[_Sample]]] = field(default_factory=dict)
    _seen: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        if not 0.0 <= self.idle_percent <= 100.0:
            raise ValueError(f"idle_percent: {self.idle_percent!r} is not in 0..100")
        if not self.idle_after_s > 0:
            raise ValueError(f"idle_after_s: {self.idle_after_s!r} is not a positive duration")

    # --- allocation (the pool log) ---------------------------------------------------
    def hold(self, job_id: str, attempt: int, team: str, pool: str, workers: int, worker_milli: int,
             time: float, name: str = "") -> None:
        before = self._holds.get((job_id, attempt))
        if before is not None:
            # The reducer bumps the attempt whenever a job lets its GPUs go, so an attempt
            # holding again is not expected; should it happen, the hold is reopened (the
            # gap counts as held) rather than replaced (which would lose its earlier time).
            before.end = None
        else:
            self._holds[(job_id, attempt)] = _Hold(team, pool, workers, worker_milli, time, name=name)
        self._open[job_id] = attempt

    def release(self, job_id: str, attempt: int, time: float) -> None:
        hold = self._holds.get((job_id, attempt))
        if hold is not None and hold.end is None:
            hold.end = max(hold.start, time)
        if self._open.get(job_id) == attempt:
            del self._open[job_id]

    def observe(self, job: JobState, time: float) -> None:
        """Call after every accepted event that changed ``job``; ``time`` is the event's."""
        holding = self._open.get(job.job_id)
        if holding is not None and (holding != job.attempt or not job.phase.holds_gpus):
            self.release(job.job_id, holding, time)
        if job.phase.holds_gpus and job.job_id not in self._open:
            self.hold(job.job_id, job.attempt, job.team, job.spec.pool, job.spec.workers,
                      job.spec.resources.milli, time, job.spec.name)

    # --- usage records ---------------------------------------------------------------
    def add(self, usage: WorkerUsage) -> bool:
        """Fold one record; False when its id was folded already."""
        if usage.record_id in self._seen:
            return False
        self._seen.add(usage.record_id)
        measured = [g for g in usage.gpus if g.measured]
        sample = _Sample(
            start=usage.time - usage.window_s, end=usage.time, record_id=usage.record_id,
            used_milli=sum(g.milli * g.sm_percent / 100 for g in measured),
            unmeasured_milli=sum(g.milli for g in usage.gpus if not g.measured),
            total_milli=sum(g.milli for g in usage.gpus),
            busy=max(g.sm_percent for g in measured) >= self.idle_percent if measured else None,
            simulated=usage.simulated)
        by_worker = self._samples.setdefault((usage.job_id, usage.attempt), {})
        by_worker.setdefault(usage.worker, []).append(sample)
        return True

    # --- the report ------------------------------------------------------------------
    def report(self, now: float) -> UtilizationReport:
        """Open allocations count up to ``now``."""
        jobs: dict[str, JobUsage] = {}
        for (job_id, attempt), hold in sorted(self._holds.items()):
            hours, idle_s, idle_now = self._attempt(hold, self._samples.get((job_id, attempt), {}), now)
            before = jobs.get(job_id)
            if before is not None:
                hours = before.hours + hours
                idle_s, idle_now = max(idle_s, before.idle_s), idle_now or before.idle_now
            jobs[job_id] = JobUsage(job_id, hold.team, hold.pool, hours, idle_s,
                                    idle_s >= self.idle_after_s, idle_now, hold.name)
        teams: dict[str, GpuHours] = defaultdict(GpuHours)
        pools: dict[str, GpuHours] = defaultdict(GpuHours)
        total = GpuHours()
        for job in jobs.values():
            teams[job.team] += job.hours
            pools[job.pool] += job.hours
            total += job.hours
        return UtilizationReport(jobs, dict(sorted(teams.items())), dict(sorted(pools.items())), total,
                                 self._unattributed())

    def _unattributed(self) -> int:
        count = 0
        for key, by_worker in self._samples.items():
            hold = self._holds.get(key)
            for worker, samples in by_worker.items():
                if hold is None or worker >= hold.workers:
                    count += len(samples)
        return count

    def _attempt(self, hold: _Hold, by_worker: dict[int, list[_Sample]], now: float) -> tuple[GpuHours, float, bool]:
        start = hold.start
        end = hold.end if hold.end is not None else max(start, now)
        allocated = hold.workers * hold.worker_milli * (end - start)
        used = unmeasured = 0.0
        simulated = False
        clipped: list[tuple[float, float, str, bool | None]] = []
        for worker, samples in by_worker.items():
            if worker >= hold.workers:
                continue
            inside = [(max(s.start, start), min(s.end, end), s) for s in samples]
            covered: list[list[float]] = []   # merged spans already counted, by end
            for a, b, s in sorted((c for c in inside if c[1] > c[0]), key=lambda c: (c[1], c[0], c[2].record_id)):
                new = _uncovered(covered, a, b)
                # a record claiming more milli than the worker holds is scaled down to it
                scale = min(1.0, hold.worker_milli / s.total_milli) if s.total_milli else 0.0
                used += new * s.used_milli * scale
                unmeasured += new * s.unmeasured_milli * scale
                simulated = simulated or s.simulated
                clipped.append((a, b, s.record_id, s.busy))
        idle_s, trailing = self._idle(clipped)
        hours = GpuHours(allocated / _MS_PER_HOUR, used / _MS_PER_HOUR, unmeasured / _MS_PER_HOUR, simulated)
        return hours, idle_s, hold.end is None and trailing >= self.idle_after_s

    @staticmethod
    def _idle(clipped: list[tuple[float, float, str, bool | None]]) -> tuple[float, float]:
        """(longest idle stretch, the stretch still running at the last sample)."""
        longest = 0.0
        run_start: float | None = None
        run = 0.0
        for a, b, _, busy in sorted(clipped, key=lambda c: (c[1], c[0], c[2])):
            if busy is None:
                continue
            if busy:
                run_start, run = None, 0.0
                continue
            if run_start is None:
                run_start = a
            run = b - run_start
            longest = max(longest, run)
        return longest, run


def _uncovered(covered: list[list[float]], a: float, b: float) -> float:
    """Length of [a, b] not yet in ``covered`` (disjoint spans, in order), which then
    takes it in. Spans come in order of their ends, so only the last spans can overlap
    the new one: they are merged with it (amortised O(1) a span)."""
    overlap, lo = 0.0, a
    while covered and covered[-1][1] >= a:
        s0, s1 = covered.pop()
        overlap += max(0.0, min(s1, b) - max(s0, a))
        lo = min(lo, s0)
    covered.append([lo, b])
    return (b - a) - overlap
