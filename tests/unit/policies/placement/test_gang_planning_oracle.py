"""Gang planning decides exactly what the planner decided when it computed every node's
capacity and the policy's rank of every candidate for every gang (``topology_oracle``,
a frozen copy): on random clusters (rack and spine labels or none, nodes partly used,
MIG set up or not), for whole-GPU, share and MIG workers, under several policies, gang
after gang in one statement, and through a whole scheduling cycle."""
from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpusched.core import events as ev
from gpusched.core.digest import digest
from gpusched.core.model import JobSpec, WorkerResources
from gpusched.policies import scheduler as scheduler_module
from gpusched.policies.memory import CycleMemory
from gpusched.policies.placement.gang import place_gang
from gpusched.policies.placement.registry import make_placement
from gpusched.policies.scheduler import Scheduler, SchedulerConfig
from gpusched.policies.statement import tentative
from tests.unit.core.builders import Log
from tests.unit.policies.placement_cases import node
from tests.unit.policies.placement.placement_strategies import MIG_SETUPS, with_mig
from tests.unit.policies.placement.topology_oracle import oracle_place_gang

POLICIES = ("best-fit", "fgd", "fgd-lookahead", "gpu-packing", "dot-product", "gpu-clustering")

nodes_st = st.lists(
    st.tuples(st.sampled_from([2, 4, 8]), st.sampled_from(["H100-80GB", "A10-24GB"]),
              st.sampled_from([16_000, 64_000, 128_000]), st.sampled_from(["", "r1", "r2", "r3"]),
              st.sampled_from(["", "s0", "s1"]), st.sampled_from(MIG_SETUPS)),
    min_size=1, max_size=10)

worker_st = st.one_of(
    st.builds(lambda g, c: WorkerResources(gpus=g, cpu_milli=c, memory_mib=c),
              st.sampled_from([1, 2, 4, 8]), st.sampled_from([0, 4000, 16_000])),
    st.builds(lambda m, c: WorkerResources(gpu_milli=m, cpu_milli=c), st.integers(100, 900),
              st.sampled_from([0, 2000])),
    st.builds(lambda p: WorkerResources(mig_profile=p, cpu_milli=1000),
              st.sampled_from(["1g.10gb", "2g.20gb", "3g.40gb"])),
)
gangs_st = st.lists(st.tuples(worker_st, st.integers(2, 6)), min_size=1, max_size=6)
busy_st = st.lists(worker_st, max_size=12)


def cluster(spec, labelled: bool) -> Log:
    def labels(rack: str, spine: str):
        if not labelled:
            return ()
        return tuple((k, v) for k, v in (("rack", rack), ("spine", spine)) if v)
    return Log(*(with_mig(node(f"n{i}", gpus=g, model=m, cpu=cpu, mem=512_000, labels=labels(r, s)), setup)
                 for i, (g, m, cpu, r, s, setup) in enumerate(spec)))


def fill(log: Log, busy: list[WorkerResources]) -> None:
    """Leave the nodes partly used: one cycle of one-worker jobs, applied."""
    for i, res in enumerate(busy):
        assert log.submit(f"busy{i}", JobSpec(name=f"busy{i}", team="t0", resources=res)).accepted
    for d in Scheduler(SchedulerConfig(queue="fifo", placement="best-fit")).cycle(log.state, log.now, CycleMemory()):
        assert log(ev.JobPlaced, job_id=d.job_id, attempt=d.attempt, workers=d.workers).accepted


def plain(placed) -> tuple | None:
    return None if placed is None else tuple((w.worker, w.node, w.gpus) for w in placed)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=nodes_st, labelled=st.booleans(), busy=busy_st, gangs=gangs_st,
       policy=st.sampled_from(POLICIES))
def test_gangs_in_one_statement_are_placed_as_the_oracle_places_them(nodes, labelled, busy, gangs, policy):
    log = cluster(nodes, labelled)
    fill(log, busy)
    for i, (res, workers) in enumerate(gangs):
        assert log.submit(f"g{i}", JobSpec(name=f"g{i}", team="t1", resources=res, workers=workers)).accepted
    jobs = [log.state.jobs[f"g{i}"] for i in range(len(gangs))]
    placement = make_placement(policy)
    before = digest(log.state)
    with tentative(log.state) as statement:
        live = [plain(place_gang(log.state, job, placement, statement)) for job in jobs]
    assert digest(log.state) == before
    with tentative(log.state) as statement:
        oracle = [plain(oracle_place_gang(log.state, job, placement, statement)) for job in jobs]
    assert live == oracle


def many_gangs(log: Log, count: int) -> None:
    shapes = [WorkerResources(gpus=8, cpu_milli=4000, memory_mib=4096),
              WorkerResources(gpus=2, cpu_milli=1000, memory_mib=1024),
              WorkerResources(gpu_milli=400, cpu_milli=1000),
              WorkerResources(mig_profile="1g.10gb", cpu_milli=500),
              WorkerResources(gpus=1, cpu_milli=2000, memory_mib=2048)]
    for i in range(count):
        res = shapes[i % len(shapes)]
        workers = 1 if i % 3 == 0 else 2 + i % 5
        assert log.submit(f"j{i}", JobSpec(name=f"j{i}", team=f"t{i % 3}", resources=res,
                                           workers=workers)).accepted


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("labelled", [False, True])
def test_a_cycle_of_many_gangs_decides_as_the_oracle(policy, labelled):
    spec = [(8, "H100-80GB" if i % 5 else "A10-24GB", 128_000, f"r{i % 4}", f"s{i % 2}", MIG_SETUPS[i % 5])
            for i in range(40)]
    log = cluster(spec, labelled)
    fill(log, [WorkerResources(gpus=1 + i % 3, cpu_milli=8000) for i in range(30)])
    many_gangs(log, 60)
    live = Scheduler(SchedulerConfig(queue="fifo", placement=policy)).cycle(log.state, log.now, CycleMemory())
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(scheduler_module, "place_gang", oracle_place_gang)
        oracle = Scheduler(SchedulerConfig(queue="fifo", placement=policy)).cycle(log.state, log.now, CycleMemory())
    assert sum(len(d.workers) > 1 for d in live) >= 5, "the cycle must place gangs to compare"
    assert [(d.job_id, d.workers) for d in live] == [(d.job_id, d.workers) for d in oracle]


@pytest.mark.parametrize("policy", POLICIES)
def test_the_rack_needing_fewer_nodes_when_the_count_is_not_a_multiple(policy):
    # r1's nodes take 3 workers each (CPU), r2's take all 4: four workers need two nodes
    # of r1 but one of r2, though r1 would be left fuller.
    log = Log(node("a1", gpus=4, cpu=12_000, labels=(("rack", "r1"),)),
              node("a2", gpus=4, cpu=12_000, labels=(("rack", "r1"),)),
              node("b1", gpus=8, cpu=128_000, labels=(("rack", "r2"),)),
              node("b2", gpus=8, cpu=128_000, labels=(("rack", "r2"),)))
    res = WorkerResources(gpus=1, cpu_milli=4000)
    assert log.submit("g", JobSpec(name="g", team="t", resources=res, workers=4)).accepted
    placement = make_placement(policy)
    with tentative(log.state) as statement:
        live = plain(place_gang(log.state, log.state.jobs["g"], placement, statement))
    with tentative(log.state) as statement:
        oracle = plain(oracle_place_gang(log.state, log.state.jobs["g"], placement, statement))
    assert live == oracle
    assert {n for _, n, _ in live} in ({"b1"}, {"b2"})
