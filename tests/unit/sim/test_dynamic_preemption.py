"""The dynamic simulator runs the preemptor: victims leave, are requeued, and their
records count the preemption and the GPU time it lost."""
from __future__ import annotations

import dataclasses
import math

import pytest

from gpusched.core.model import JobSpec, WorkerResources
from gpusched.policies.scheduler import SchedulerConfig
from gpusched.sim.dynamic import DynamicSimulator
from gpusched.sim.dynamic_configs import split_preemption, split_preemption_rules
from gpusched.sim.metrics import summarize
from gpusched.sim.synthetic import synthetic_workload
from gpusched.sim.workload import Arrival, Workload, gpu_node

CONFIG = SchedulerConfig(queue="priority", backfill=False, reserve_after_s=float("inf"))
LOW_RUNTIME_S, HIGH_AT_S, HIGH_RUNTIME_S = 10_000.0, 1_000.0, 2_000.0


def one_node(checkpoint_interval_s: float = 0.0) -> Workload:
    """One 8-GPU node; a best-effort job takes it at 0, a high-priority job wants it at 1,000 s."""
    low = JobSpec(name="low", team="batch", priority_class="best-effort", resources=WorkerResources(gpus=8),
                  max_runtime_s=LOW_RUNTIME_S, simulated_duration_s=LOW_RUNTIME_S,
                  checkpoint_interval_s=checkpoint_interval_s)
    high = JobSpec(name="high", team="llm", priority_class="training-high", resources=WorkerResources(gpus=8),
                   max_runtime_s=HIGH_RUNTIME_S, simulated_duration_s=HIGH_RUNTIME_S)
    node = gpu_node("n0", "H100-80GB", 8, 128_000, 1_048_576)
    return Workload("one-node", (node,), (Arrival(0.0, "low", low), Arrival(HIGH_AT_S, "high", high)))


def _records(result):
    return {j.job_id: j for j in result.jobs}


def test_high_priority_job_preempts_low_one_and_its_work_is_lost():
    result = DynamicSimulator(one_node(), CONFIG, preemption=True).run()
    jobs = _records(result)
    low, high = jobs["low"], jobs["high"]
    assert high.started_at == HIGH_AT_S                      # placed in the cycle after the preemption
    assert (low.preemptions, high.preemptions) == (1, 0)
    assert low.lost_gpu_s == 8 * HIGH_AT_S                   # 1,000 s on 8 GPUs, no checkpoint
    summary = summarize(result)
    assert summary["preemptions"] == 1
    assert summary["gpu_hours_lost"] == pytest.approx(8 * HIGH_AT_S / 3600)
    # The victim restarts when the node frees and runs all of its work again.
    assert low.started_at == 0.0
    assert low.ended_at == HIGH_AT_S + HIGH_RUNTIME_S + LOW_RUNTIME_S


def test_checkpoints_bound_the_work_lost_and_shorten_the_rerun():
    result = DynamicSimulator(one_node(checkpoint_interval_s=300.0), CONFIG, preemption=True).run()
    low = _records(result)["low"]
    assert low.preemptions == 1
    assert low.lost_gpu_s == 8 * 100.0                       # checkpoint at 900 s, preempted at 1,000 s
    assert low.ended_at == HIGH_AT_S + HIGH_RUNTIME_S + (LOW_RUNTIME_S - 900.0)


def test_without_the_preemptor_the_high_job_waits_and_nothing_is_lost():
    result = DynamicSimulator(one_node(), CONFIG, preemption=False).run()
    jobs = _records(result)
    assert jobs["high"].started_at == LOW_RUNTIME_S
    assert summarize(result)["preemptions"] == 0 and summarize(result)["gpu_hours_lost"] == 0


def test_preempting_runs_are_deterministic():
    wl = synthetic_workload(3, horizon_s=4 * 3600, h100_nodes=6, l40s_nodes=2, flood_jobs=20)
    config = dataclasses.replace(SchedulerConfig(), quotas=wl.quotas)
    # no bound on work lost for a wait: the preemptor acts within these four hours
    first, second = (DynamicSimulator(wl, config, cycle_interval_s=10.0, preemption=True,
                                      preemption_rules={"max_loss_per_wait": math.inf}).run() for _ in range(2))
    assert sum(j.preemptions for j in first.jobs) > 0       # the scenario exercises the preemptor
    assert first.jobs == second.jobs and first.samples == second.samples


def test_no_preemption_suffix():
    assert split_preemption("defaults+no-preemption") == ("defaults", False)
    assert split_preemption("fair-share+best-fit+backfill") == ("fair-share+best-fit+backfill", True)


def test_the_log_holds_the_checkpoints_so_the_victim_is_the_one_that_loses_least():
    """Two 8-GPU nodes: ``plain`` (no checkpoints) and ``saver`` (a checkpoint every 300 s),
    both from 1 s; the high-priority job at 1,000 s stops ``saver`` (99 s lost since its
    checkpoint at 901 s) rather than ``plain`` (999 s): the simulator writes each
    checkpoint to the log (CheckpointSaved), where the preemptor reads it."""
    base = one_node()
    low = base.arrivals[0].spec
    plain = dataclasses.replace(low, name="plain")
    saver = dataclasses.replace(low, name="saver", checkpoint_interval_s=300.0)
    high = base.arrivals[1].spec
    nodes = (base.nodes[0], gpu_node("n1", "H100-80GB", 8, 128_000, 1_048_576))
    wl = Workload("two-nodes", nodes, (Arrival(1.0, "plain", plain), Arrival(1.0, "saver", saver),
                                       Arrival(HIGH_AT_S, "high", high)))
    # no bound on the work lost for a wait: the high job preempts on arrival
    jobs = _records(DynamicSimulator(wl, CONFIG, preemption=True,
                                     preemption_rules={"max_loss_per_wait": math.inf}).run())
    assert (jobs["plain"].preemptions, jobs["saver"].preemptions) == (0, 1)
    assert jobs["saver"].lost_gpu_s == 8 * 99.0


def test_a_config_sets_the_preemptors_rules():
    assert split_preemption_rules("defaults+min-runtime=30+growth=1+budget=0") == (
        "defaults", {"min_runtime_s": 30.0, "min_runtime_growth": 1.0, "preemption_budget": 0})
    sim = DynamicSimulator(one_node(), CONFIG, preemption=True, preemption_rules={"min_runtime_s": 2000.0})
    jobs = _records(sim.run())
    assert jobs["low"].preemptions == 1 and jobs["high"].started_at == 2000.0   # low ran its 2,000 s first
