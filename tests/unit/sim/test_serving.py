"""Services in the dynamic simulator (``gpusched.sim.serving``): replicas scale with a
diurnal request curve through the autoscaler, start up before they serve, preempt
training for their GPUs in a shared cluster and stay in their own pool in a static split;
and a run without services is what it was before services existed."""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import replace

import pytest

from gpusched.core.model import JobKind, JobSpec, WorkerResources
from gpusched.policies.scheduler import SchedulerConfig
from gpusched.sim.dynamic import DynamicSimulator
from gpusched.sim.dynamic_configs import parse_config
from gpusched.sim.metrics import summarize
from gpusched.sim.serving import INFERENCE_POOL, diurnal_services
from gpusched.sim.synthetic import synthetic_workload
from gpusched.sim.workload import Arrival, Workload, gpu_node

HOUR = 3600.0


def workload(training_jobs: int) -> Workload:
    """Two 8-GPU nodes and ``training_jobs`` one-GPU training jobs of 3 h at t=0."""
    nodes = tuple(gpu_node(f"n{i}", "H100", 8, 96_000, 1_000_000) for i in range(2))
    spec = JobSpec(name="train", team="research", priority_class="training", kind=JobKind.TRAINING,
                   resources=WorkerResources(gpus=1, cpu_milli=4000, memory_mib=16_384),
                   max_runtime_s=3 * HOUR, simulated_duration_s=3 * HOUR)
    arrivals = tuple(Arrival(0.0, f"t{i}", spec) for i in range(training_jobs))
    return Workload("tiny", nodes, arrivals)


def one_service(startup_s: float = 60.0, split: str = "shared", seed: int = 0):
    """One service over a 2 h day: 1 replica at the trough (t=0, t=2h), 6 at the peak (1h)."""
    loads = diurnal_services(1, seed, 2 * HOUR, period_s=2 * HOUR, capacity_rps=10.0, max_replicas=6,
                             startup_s=startup_s, split=split)
    service = replace(loads.services[0], peak_rps=55.0, peak_to_trough=6.0, phase_s=0.0, noise=0.0)
    return replace(loads, services=(service,))


def simulate(loads, training_jobs: int = 12, **rules):
    sim = DynamicSimulator(workload(training_jobs), SchedulerConfig(queue="priority", placement="best-fit"),
                           "p", 10.0, preemption=True, preemption_rules=rules or None, services=loads)
    return sim, sim.run()


def test_desired_replicas_rise_with_the_curve_and_fall_after_it():
    sim, _ = simulate(one_service())
    minutes = sim.serving.minutes["svc0"]
    desired = [m[3] for m in minutes]
    assert desired[0] == 1
    peak = max(range(len(minutes)), key=lambda i: desired[i])
    assert desired[peak] == 6
    assert 0.8 * HOUR <= minutes[peak][0] <= 1.5 * HOUR
    assert desired[-1] <= 2   # back down near the trough, after the scale-down window


def test_availability_is_the_minutes_ready_reached_what_the_load_needs():
    slow_sim, slow = simulate(one_service(startup_s=600.0))
    _, quick = simulate(one_service(startup_s=30.0))
    minutes = slow_sim.serving.minutes["svc0"]
    assert len(minutes) == 121   # t = 0, 60, ..., 7200
    assert all(m[2] == max(1, min(6, math.ceil(m[1] / 10.0 - 1e-9))) for m in minutes)
    expected = sum(m[4] >= m[2] for m in minutes) / len(minutes)
    assert slow.services["availability"] == pytest.approx(expected)
    assert slow.services["per_service"]["svc0"]["availability"] == pytest.approx(expected)
    assert slow.services["availability"] < quick.services["availability"] <= 1.0
    assert slow.services["availability"] < 0.9


@pytest.mark.parametrize("startup_s", [60.0, 600.0])
def test_scale_up_latency_is_at_least_the_start_up_time(startup_s):
    sim, result = simulate(one_service(startup_s=startup_s))
    latencies = sim.serving.latencies["svc0"]
    assert len(latencies) >= 5   # 1 -> 6 replicas: five added at least
    assert min(latencies) >= startup_s
    assert result.services["scale_up_latency_s"]["p50"] >= startup_s


def _nodes(sim, service: bool) -> set[str]:
    return {w.node for job in sim.state.jobs.values() if bool(job.spec.service) == service for w in job.workers}


def test_the_static_split_keeps_replicas_off_the_training_nodes():
    static, result = simulate(one_service(split="static"))
    pools = {n.name: n.pool for n in static.workload.nodes}
    assert sorted(pools.values()) == ["default", INFERENCE_POOL]   # one 8-GPU node holds the 6 replicas
    replica_nodes, training_nodes = _nodes(static, True), _nodes(static, False)
    assert replica_nodes and training_nodes
    assert {pools[n] for n in replica_nodes} == {INFERENCE_POOL}
    assert {pools[n] for n in training_nodes} == {"default"}
    assert result.services["split"] == "static"
    shared, _ = simulate(one_service())
    assert _nodes(shared, True) & _nodes(shared, False)   # shared: replicas beside training


def test_replicas_preempt_training_in_a_shared_cluster_and_not_in_a_static_split():
    """16 training jobs fill both nodes: in the shared cluster the replicas' GPUs come
    from training victims, whose lost work is counted; split, nothing is taken."""
    _, shared = simulate(one_service(), training_jobs=16, min_runtime_s=0.0, max_loss_per_wait=1000.0)
    _, static = simulate(one_service(split="static"), training_jobs=16, min_runtime_s=0.0,
                         max_loss_per_wait=1000.0)
    assert shared.services["training_victims_of_replicas"] > 0
    assert shared.services["training_gpu_hours_lost_to_replicas"] > 0
    assert static.services["training_victims_of_replicas"] == 0
    assert static.services["training_gpu_hours_lost_to_replicas"] == 0
    assert shared.services["training_gpu_hours_in_window"] > static.services["training_gpu_hours_in_window"]


def test_a_run_with_services_is_the_same_for_a_seed():
    loads = one_service(seed=4)
    loads = replace(loads, services=(replace(loads.services[0], noise=0.2),))
    first, second = (summarize(simulate(loads)[1]) for _ in range(2))
    first.pop("wall_s"), second.pop("wall_s")
    assert first == second
    other = replace(loads, seed=5)
    assert summarize(simulate(other)[1])["services"] != first["services"]


def test_a_run_without_services_is_unchanged():
    """Figures recorded from this run before services were added to the simulator."""
    wl = synthetic_workload(3, 3600, 3.0, worker_gpus=8)
    _, config = parse_config("priority+best-fit", wl.quotas, 3600, 6 * 3600)
    summary = summarize(DynamicSimulator(wl, config, "p", 10.0, preemption=True,
                                         preemption_rules={"max_loss_per_wait": 1.0}).run())
    summary.pop("wall_s")
    assert "services" not in summary
    assert (summary["jobs"], summary["cycles"], summary["preemptions"]) == (631, 771, 116)
    assert summary["gpu_hours_lost"] == pytest.approx(84.17708019614462)
    assert summary["jct_s"]["mean"] == pytest.approx(9527.008057826622)
    assert summary["queueing_delay_s"]["mean"] == pytest.approx(230.60554128804534)
    assert summary["gpu_allocation"] == pytest.approx(0.7639723300493738)
    assert hashlib.sha256(json.dumps(summary, sort_keys=True).encode()).hexdigest() == \
        "3eb78ac3145c8d2ed3ed9fc09a5efc16bc838d12d717fe80c34613c3a1672383"
