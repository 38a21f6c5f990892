"""No starvation with the default settings, on the dynamic simulator (production reducer
and scheduler): the starving cases of settings a user would pick, and a bound on the
worst wait of any job under the defaults, for random workloads."""
from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings, strategies as st

from gpusched.core.model import JobSpec, WorkerResources
from gpusched.policies.scheduler import SchedulerConfig
from gpusched.sim.dynamic import DynamicSimulator
from gpusched.sim.workload import Arrival, Workload
from tests.unit.core.builders import make_node

CYCLE_S = 10.0


def one_gpu_stream_and_a_whole_node_job(estimate_s: float = 400.0) -> Workload:
    """One 8-GPU node. Team ``batch`` submits a 1-GPU job of 100 s every 15 s until
    t=4000 (about 7 GPUs busy at any time); team ``llm`` submits an 8-GPU job at t=60.
    ``estimate_s``: the big job's time limit (0: none)."""
    node = make_node("n1", gpus=8, cpu=64_000, mem=512_000)
    small = WorkerResources(gpus=1)
    arrivals = [Arrival(15.0 * i, f"b{i:03d}", JobSpec(name=f"b{i:03d}", team="batch", resources=small,
                                                       max_runtime_s=100, simulated_duration_s=100))
                for i in range(267)]
    big = JobSpec(name="big", team="llm", resources=WorkerResources(gpus=8), max_runtime_s=estimate_s,
                  simulated_duration_s=300)
    arrivals.append(Arrival(60.0, "big", big))
    return Workload("stream", (node,), tuple(sorted(arrivals, key=lambda a: (a.time, a.job_id))))


def start_of(config: SchedulerConfig, workload: Workload, job_id: str = "big") -> float | None:
    result = DynamicSimulator(workload, config, cycle_interval_s=CYCLE_S).run()
    return next(j.started_at for j in result.jobs if j.job_id == job_id)


FAIR_SHARE_AGING = {"queue": "fair-share", "aging_s": 6 * 3600.0}


def test_fair_share_with_aging_without_reservations_starves_the_whole_node_job():
    config = SchedulerConfig(**FAIR_SHARE_AGING, backfill=False, reserve_after_s=math.inf)
    assert start_of(config, one_gpu_stream_and_a_whole_node_job()) >= 3990.0   # only once the stream stopped


def test_without_backfill_the_wait_bound_reserves_and_the_job_starts():
    config = SchedulerConfig(**FAIR_SHARE_AGING, backfill=False, reserve_after_s=300.0)
    # reserved by the first cycle after 60 + 300 s; every 1-GPU job then running ends within 100 s
    assert start_of(config, one_gpu_stream_and_a_whole_node_job()) <= 60 + 300 + 100 + CYCLE_S


def test_the_defaults_start_it_within_a_runtime_of_the_small_jobs():
    assert start_of(SchedulerConfig(), one_gpu_stream_and_a_whole_node_job()) <= 60 + 100 + CYCLE_S


def test_backfill_among_jobs_without_estimate_reserves_with_the_default_estimate():
    """The 1-GPU stream has no estimates (no time limit, no pool default). Without an
    estimate for them, the gang's reservation waits on jobs that never end: EASY reserves
    nothing and the stream keeps taking every GPU that frees."""
    node = make_node("n1", gpus=8, cpu=64_000, mem=512_000)
    small = WorkerResources(gpus=1)
    arrivals = [Arrival(15.0 * i, f"s{i:03d}", JobSpec(name=f"s{i:03d}", team="a", resources=small,
                                                       simulated_duration_s=100))
                for i in range(267)]
    gang = JobSpec(name="gang", team="a", resources=WorkerResources(gpus=8), max_runtime_s=300,
                   simulated_duration_s=300)
    arrivals.append(Arrival(60.0, "gang", gang))
    wl = Workload("unknown-runtimes", (node,), tuple(sorted(arrivals, key=lambda a: (a.time, a.job_id))))
    easy = SchedulerConfig(queue="fifo", backfill=True, reserve_after_s=math.inf)
    # Each running 1-GPU job is expected to end a day after it started: the gang is
    # reserved for at once, no later 1-GPU job ends before that, so none may start; the
    # gang starts when the ones running end (100 s).
    assert start_of(easy, wl, "gang") <= 60 + 100 + CYCLE_S


# --- a bound on every job's wait under the defaults ---------------------------------------
NODES, GPUS = 2, 8
SIZES = ((1, 1), (1, 2), (1, 4), (1, 8), (2, 8))   # (workers, GPUs a worker): every one fits
AGING_S = 1800.0


@st.composite
def workloads(draw) -> Workload:
    """Two teams; 1-, 2-, 4-, 8-GPU jobs and 2 x 8-GPU gangs, runs of 50-1000 s, some
    without an estimate; arrivals in the first ~2000 s."""
    nodes = tuple(make_node(f"n{i}", gpus=GPUS, cpu=64_000, mem=512_000) for i in range(NODES))
    arrivals, t = [], 0.0
    for i in range(draw(st.integers(5, 60))):
        t += draw(st.floats(0, 60, allow_nan=False))
        workers, gpus = draw(st.sampled_from(SIZES))
        runtime = draw(st.integers(50, 1000))
        estimate = draw(st.sampled_from((0, runtime, 2 * runtime)))   # 0: none (the default estimate)
        spec = JobSpec(name=f"j{i}", team=draw(st.sampled_from(("a", "b"))), workers=workers,
                       resources=WorkerResources(gpus=gpus), max_runtime_s=estimate, simulated_duration_s=runtime)
        arrivals.append(Arrival(t, f"j{i:03d}", spec))
    return Workload("random", nodes, tuple(arrivals))


DEFAULTS = SchedulerConfig(aging_s=AGING_S, default_estimate_s=2000.0)


def wait_bound(workload: Workload, starts: dict[str, float], job_id: str, longest: float) -> float:
    """The bound on ``job_id``'s wait under the defaults: once it has waited ``AGING_S``
    it goes before every job that has not, behind only the older aged jobs still
    waiting; the first of those is the first blocked job, so it is reserved for (EASY),
    and starts by its shadow time, within the longest estimate of what runs, plus a
    cycle. So each older job waiting then costs at most one ``longest + CYCLE_S``."""
    index = {a.job_id: i for i, a in enumerate(workload.arrivals)}
    mine = workload.arrivals[index[job_id]]
    aged_at = mine.time + AGING_S
    older_waiting = sum(1 for a in workload.arrivals[:index[job_id]] if starts[a.job_id] > aged_at)
    return AGING_S + (older_waiting + 1) * (longest + CYCLE_S)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_every_job_starts_within_the_bound_under_the_defaults(workload):
    result = DynamicSimulator(workload, DEFAULTS, cycle_interval_s=CYCLE_S).run()
    starts = {j.job_id: j.started_at for j in result.jobs}
    assert None not in starts.values()
    longest = max(a.spec.max_runtime_s or DEFAULTS.default_estimate_s for a in workload.arrivals)
    for a in workload.arrivals:
        waited = starts[a.job_id] - a.time
        assert waited <= wait_bound(workload, starts, a.job_id, longest), a.job_id
