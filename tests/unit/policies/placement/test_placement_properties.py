"""Properties of every placement policy, on random small clusters and job sequences:

* whatever a scheduling cycle proposes, applied through the reducer, is accepted and
  never allocates more CPU, memory, GPU milli, GPU memory or MIG slices than there are,
  nor a form the GPU's MIG mode refuses (whole GPUs or shares on a MIG-enabled GPU,
  slices on one with MIG off, slices off its instances without dynamic MIG);
* gangs get all their workers or none;
* a cycle leaves the state as it found it (digest);
* the indexed best-fit answers exactly what a scan of every node answers;
* the static simulator gives the same result for the same seed.
"""
from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpusched.core import events as ev
from gpusched.core.digest import digest
from gpusched.core.mig import FULL_MASK
from gpusched.core.model import JobSpec, MigMode, WorkerResources
from gpusched.core.state import ClusterState
from gpusched.policies.memory import CycleMemory
from gpusched.policies.statement import tentative
from gpusched.policies.gpu_fit import fit
from gpusched.policies.placement.gang import place_gang
from gpusched.policies.placement.registry import PLACEMENTS, make_placement
from gpusched.policies.placement.heuristics import best_fit_key
from gpusched.policies.scheduler import Scheduler, SchedulerConfig
from gpusched.sim.static import pack
from gpusched.sim.traces import Task
from tests.unit.core.builders import Log
from tests.unit.policies.placement_cases import node
from tests.unit.policies.placement.placement_strategies import (
    MODELS, MIG_SETUPS, resources_st, jobs_st, with_mig,
)

nodes_st = st.lists(
    st.tuples(st.integers(0, 8), st.sampled_from(MODELS), st.sampled_from([8000, 32_000, 64_000]),
              st.sampled_from([16_000, 128_000]), st.sampled_from(["r1", "r2"]), st.sampled_from(MIG_SETUPS)),
    min_size=1, max_size=5)


def cluster(spec) -> Log:
    return Log(*(with_mig(node(f"n{i}", gpus=g, model=m, cpu=cpu, mem=mem, labels=(("rack", r),)), setup)
                 for i, (g, m, cpu, mem, r, setup) in enumerate(spec)))


def check_capacity(state: ClusterState) -> None:
    for n in state.nodes.values():
        assert 0 <= n.used_cpu <= n.info.cpu_milli and 0 <= n.used_mem <= n.info.memory_mib
        for g in n.gpus:
            assert 0 <= g.used_milli <= 1000 and 0 <= g.mig_mask <= FULL_MASK
            assert 0 <= g.used_memory_mib <= g.info.memory_mib
            assert not (g.used_milli and g.mig_mask), "a GPU both shared and cut into MIG"
            assert not g.mig_mask or g.info.mig_capable
            assert not g.mig_mask or g.info.mig_mode is not MigMode.DISABLED, "a slice with MIG off"
            assert not g.used_milli or g.info.mig_mode is not MigMode.ENABLED, "a whole GPU or share with MIG on"
        for job_id in n.jobs:
            for w in state.jobs[job_id].workers:
                for s in w.gpus if w.node == n.name else ():
                    info = n.gpus[s.index].info
                    if s.mig_profile and info.mig_mode is MigMode.ENABLED and not n.info.dynamic_mig:
                        assert (s.mig_start, s.mig_profile[0]) in {(m.start, m.profile[0]) for m in info.mig_instances}


@pytest.mark.parametrize("policy", sorted(PLACEMENTS))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=nodes_st, rounds=st.lists(jobs_st, min_size=1, max_size=3), finish=st.randoms(use_true_random=False))
def test_cycles_never_overallocate_and_gangs_are_whole(policy, nodes, rounds, finish):
    log = cluster(nodes)
    scheduler = Scheduler(SchedulerConfig(queue="fifo", placement=policy))
    count = 0
    for jobs in rounds:
        for res, workers in jobs:
            spec = JobSpec(name=f"j{count}", team=f"t{count % 2}", workers=workers, resources=res)
            assert log.submit(f"j{count}", spec).accepted
            count += 1
        before = digest(log.state)
        decisions = scheduler.cycle(log.state, log.now, CycleMemory())
        assert digest(log.state) == before, "a cycle must leave the state as the log made it"
        for d in decisions:
            job = log.job(d.job_id)
            assert sorted(w.worker for w in d.workers) == list(range(job.spec.workers))
            out = log(ev.JobPlaced, job_id=d.job_id, attempt=d.attempt, workers=d.workers)
            assert out.accepted, out.reason
            check_capacity(log.state)
        # Free a random part of what runs, so the next round places into a used cluster.
        for job in [j for j in log.state.jobs.values() if j.phase.holds_gpus]:
            if finish.random() < 0.4:
                assert log(ev.JobCancelled, job_id=job.job_id).accepted
                check_capacity(log.state)
                log.stopped(job.job_id)
        check_capacity(log.state)


@settings(max_examples=80, deadline=None)
@given(nodes=nodes_st, jobs=st.lists(resources_st, min_size=1, max_size=25))
def test_indexed_best_fit_equals_a_scan(nodes, jobs):
    log = cluster(nodes)
    state = log.state
    for i, res in enumerate(jobs):
        assert log.submit(f"j{i}", JobSpec(name=f"j{i}", team="t", resources=res)).accepted
    order = {name: i for i, name in enumerate(state.nodes)}
    with tentative(state) as statement:
        for i, res in enumerate(jobs):
            options = [(best_fit_key(n), order[n.name], n.name) for n in state.nodes.values()
                       if fit(n, "default", res) is not None]
            if res.is_mig:      # MIG: GPUs already cut first, then the key
                options = [((state.nodes[o[2]].gpus[fit(state.nodes[o[2]], "default", res)[0].index].mig_mask == 0),)
                           + o for o in options]
            placed = place_gang(state, state.jobs[f"j{i}"], make_placement("best-fit"), statement)
            if not options:
                assert placed is None
            else:
                assert placed is not None and placed[0].node == min(options)[-1]


def tiny_trace(seed: int) -> tuple[list, list[Task]]:
    rng = random.Random(seed)
    nodes = [node(f"n{i}", gpus=rng.choice([2, 4, 8]), cpu=64_000, mem=256_000) for i in range(12)]
    shapes = [WorkerResources(gpu_milli=m, cpu_milli=2000) for m in (250, 470, 810)] + \
             [WorkerResources(gpus=g, cpu_milli=8000) for g in (1, 1, 1, 2, 8)] + [WorkerResources(cpu_milli=4000)]
    return nodes, [Task(f"t{i}", rng.choice(shapes)) for i in range(60)]


@pytest.mark.parametrize("policy", ["best-fit", "fgd", "fgd-lookahead", "random"])
def test_static_simulation_is_a_function_of_its_seed(policy):
    nodes, tasks = tiny_trace(7)
    first = pack(nodes, tasks, policy, seed=3, label="tiny")
    assert first.curve == pack(nodes, tasks, policy, seed=3, label="tiny").curve
    assert first.placed > 0 and 0 < first.final <= 1
    assert first.curve == sorted(first.curve), "allocation only grows in a static run"
    others = {tuple(pack(nodes, tasks, policy, seed=s, label="tiny").curve) for s in (4, 5, 6)}
    assert len(others | {tuple(first.curve)}) > 1, "different seeds, different workloads"
