"""The static benchmark's waste bounds (``gpusched.sim.packing_bound``):
exact on hand-sized cases, and never above what a real policy leaves on the same arrivals."""
from __future__ import annotations

import pytest

from gpusched.core.model import GpuInfo, NodeInfo, WorkerResources
from gpusched.sim.packing_bound import INFEASIBLE, Problem, Sequence, bound, least_waste, lp_bound, most_fill
from gpusched.sim.static import pack, workload
from gpusched.sim.traces import Task



@pytest.mark.parametrize("holes, fillers, filled", [
    ({190: 2}, [160, 160, 110], 380),          # split freely: 160 + 30, then 130 + 110 (50 left over)
    ({190: 1, 350: 1}, [320], 320),            # a 320 only fits the 350 hole
    ({190: 1, 350: 1}, [160, 320], 160 + 320),  # the small one goes to the small hole
    ({190: 3}, [230, 470], 0),                 # nothing small enough
    ({}, [110], 0),
])
def test_most_fill(holes, fillers, filled):
    assert most_fill(holes, fillers) == pytest.approx(filled)


@pytest.mark.parametrize("name, problem, waste", [
    # Two forced 810s on two GPUs, one 160 to join one of them.
    ("810 holes, one filler", Problem(2, {810: 2}, {810: 2, 160: 1}, 0, True), 2 * 190 - 160),
    # Three 470s need two GPUs (a pair and one alone), so one GPU is left for the whole
    # task: only patterns of several shares find that.
    ("three 470s on two GPUs", Problem(3, {470: 3}, {470: 3}, 1, True), 3000 - 3 * 470 - 1000),
    # Whole GPUs fill what the shares leave, up to the whole GPUs offered.
    ("whole GPUs take the rest", Problem(4, {810: 1}, {810: 1}, 3, True), 190),
    ("too few whole GPUs", Problem(4, {810: 1}, {810: 1}, 1, False), 190 + 2000),
    # A jam needs every GPU used: with one share and nothing else it cannot come.
    ("no jam possible", Problem(3, {810: 1}, {810: 1}, 0, True), INFEASIBLE),
    ("more forced shares than GPUs", Problem(1, {810: 2}, {810: 2}, 0, False), INFEASIBLE),
])
def test_least_waste(name, problem, waste):
    assert least_waste(problem) == pytest.approx(waste)


def _cluster(nodes: int, gpus: int, cpu: int = 64_000) -> list[NodeInfo]:
    return [NodeInfo(name=f"n{i}", pool="default", cpu_milli=cpu, memory_mib=512_000, simulated=True,
                     gpus=tuple(GpuInfo(g, f"n{i}-gpu{g}", "V100M32", 32_768) for g in range(gpus)))
            for i in range(nodes)]


def _tasks() -> list[Task]:
    """The trace's mix in small: 810s, pairs of 470s, 320s, a few small shares, whole GPUs."""
    shapes = [(810, 0)] * 13 + [(470, 0)] * 9 + [(320, 0)] * 4 + [(160, 0)] + [(0, 1)] * 48 + [(0, 2)] * 2
    return [Task(f"t{i}", WorkerResources(gpu_milli=m, cpu_milli=2000, memory_mib=1000) if m
                 else WorkerResources(gpus=g, cpu_milli=4000, memory_mib=1000))
            for i, (m, g) in enumerate(shapes)]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_bounds_never_exceed_what_a_policy_leaves(seed):
    nodes, tasks = _cluster(6, 8), _tasks()
    gpus = sum(len(n.gpus) for n in nodes)
    counted = bound("small", seed, tasks, gpus).waste
    lp, _ = lp_bound(Sequence(workload(tasks, gpus * 1000, seed), gpus), parts=4, splits=6)
    assert lp / (gpus * 1000) > 0.01, "the 810s must leave holes"
    for policy in ("best-fit", "fgd", "fgd-lookahead"):
        left = 1 - pack(nodes, tasks, policy, seed, label="small").final
        assert left < 0.2, f"{policy} must place most of the load"
        assert counted <= left + 1e-9, policy
        assert lp / (gpus * 1000) <= left + 1e-9, policy


@pytest.mark.parametrize("seed", [1, 2])
def test_the_bounds_are_exact_where_nothing_can_share_a_gpu(seed):
    # 810s and whole GPUs only: every task takes a GPU of its own, so every policy
    # places the same 810s (all those before the last GPU is taken) and leaves 190 each.
    nodes = _cluster(4, 8)
    tasks = [Task(f"t{i}", WorkerResources(gpu_milli=810, cpu_milli=1000, memory_mib=1000) if i % 4 == 0
                  else WorkerResources(gpus=1, cpu_milli=1000, memory_mib=1000)) for i in range(40)]
    gpus = sum(len(n.gpus) for n in nodes)
    left = 1 - pack(nodes, tasks, "fgd", seed, label="tight").final
    assert 0.02 < left < 0.2
    assert bound("tight", seed, tasks, gpus).waste == pytest.approx(left)
    lp, _ = lp_bound(Sequence(workload(tasks, gpus * 1000, seed), gpus), parts=4, splits=20)
    assert lp / (gpus * 1000) == pytest.approx(left)
