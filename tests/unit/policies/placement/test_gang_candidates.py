"""A gang's capacities read only the nodes the statement's ``FreeIndex`` lists with enough
free whole GPUs (``topology.GangCapacities``): the same gangs on the same nodes and GPUs
as the full computation over every node of the pool, on random clusters (racks, spines,
two GPU models, cordoned nodes, unhealthy GPUs, busy GPUs and shares), after bookings
of the same statement; and, kept from one cycle to the next with the placement indexes,
the same decisions as cycles that read them afresh."""
from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings, strategies as st

from gpusched.core import events as ev
from gpusched.policies.memory import CycleMemory
from gpusched.policies.placement.gang import place_gang
from gpusched.policies.placement.heuristics import free_index
from gpusched.policies.placement.registry import make_placement
from gpusched.core.topology import DEFAULT_LEVELS
from gpusched.policies.placement.topology import GangCapacities
from gpusched.policies.scheduler import Scheduler, SchedulerConfig
from gpusched.policies.statement import tentative
from tests.unit.core.builders import Log, make_node, make_spec, share, whole

POOL = "default"
MODELS = ("H100-80GB", "A100-80GB")

# (GPUs, model, rack, spine, cordoned, an unhealthy GPU, busy whole GPUs, a share's milli, CPU)
cluster_node = st.tuples(st.sampled_from((4, 8)), st.sampled_from(MODELS), st.integers(0, 3), st.integers(0, 1),
                         st.sampled_from((False, False, False, True)), st.none() | st.integers(0, 7),
                         st.integers(0, 8), st.sampled_from((0, 0, 300, 800)),
                         st.sampled_from((16_000, 64_000, 256_000)))
# (workers, whole GPUs, share milli, models allowed, CPU): one-worker jobs are best-fit's,
# the rest gangs; a share when milli is set.
job = st.tuples(st.integers(1, 8), st.integers(1, 8), st.sampled_from((0, 0, 0, 500)),
                st.sampled_from(((), (), MODELS[:1], MODELS[1:])), st.sampled_from((1000, 8_000, 32_000)))


def build(nodes: list[tuple]) -> Log:
    log = Log(*(replace(make_node(f"n{i}", gpus=g, model=m, cpu=cpu, mem=1_000_000),
                        labels=(("rack", f"r{r}"), ("spine", f"s{s}")))
                for i, (g, m, r, s, _, _, _, _, cpu) in enumerate(nodes)))
    for i, (gpus, _, _, _, cordoned, sick, busy, milli, _) in enumerate(nodes):
        name = f"n{i}"
        busy = min(busy, gpus)
        if busy:
            assert log.submit(f"b{i}", make_spec(gpus=busy, cpu=0, mem=0)).accepted
            assert log.place(f"b{i}", (name, whole(*range(busy)))).accepted
        if milli and busy < gpus:
            assert log.submit(f"s{i}", make_spec(milli=milli, cpu=0, mem=0)).accepted
            assert log.place(f"s{i}", (name, share(busy, milli))).accepted
        if sick is not None and sick < gpus:
            log(ev.GpuHealthChanged, node=name, gpu_index=sick, healthy=False)
        if cordoned:
            log(ev.NodeCordoned, node=name)
    return log


def submit(log: Log, jobs: list[tuple], prefix: str = "j") -> list[str]:
    ids = []
    for i, (workers, gpus, milli, models, cpu) in enumerate(jobs):
        spec = make_spec(workers=workers, gpus=0 if milli else gpus, milli=milli, models=models, cpu=cpu, mem=1000)
        assert log.submit(f"{prefix}{i}", spec).accepted
        ids.append(f"{prefix}{i}")
    return ids


def placements(log: Log, ids: list[str], indexed: bool) -> list:
    """Each job's workers as placed in one statement, in order; ``indexed``: gangs read
    the free-capacity index, else every node (the full computation)."""
    state, policy, out = log.state, make_placement("best-fit"), []
    with tentative(state) as statement:
        if indexed:
            free_index(statement, state, POOL)
        else:
            statement.views[("gang", POOL, DEFAULT_LEVELS)] = GangCapacities(state.nodes, POOL, DEFAULT_LEVELS)   # no index to read
        for job_id in ids:
            job = state.jobs[job_id]
            placed = place_gang(state, job, policy, statement)
            out.append(None if placed is None else [(w.node, tuple((s.index, s.milli) for s in w.gpus))
                                                    for w in placed])
            gangs = statement.views.get(("gang", POOL))
            if indexed and gangs is not None:   # the kept capacities are the full ones, too
                res = job.spec.resources
                assert gangs.capacities(res) == GangCapacities(state.nodes, POOL, DEFAULT_LEVELS).capacities(res)
    return out


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(cluster_node, min_size=2, max_size=12), st.lists(job, min_size=1, max_size=10))
def test_a_gang_reading_the_index_is_placed_as_by_the_full_computation(nodes, jobs):
    log = build(nodes)
    ids = submit(log, jobs)
    assert placements(log, ids, indexed=True) == placements(log, ids, indexed=False)


def test_the_index_is_read_for_whole_gpus():
    """The candidates come from the index: a node it does not list is not asked."""
    log = build([(8, MODELS[0], 0, 0, False, None, 0, 0, 64_000)] * 3)
    res = make_spec(workers=2, gpus=8).resources
    with tentative(log.state) as statement:
        index = free_index(statement, log.state, POOL)
        assert sorted(GangCapacities(log.state.nodes, POOL, DEFAULT_LEVELS, statement.views).capacities(res)) == ["n0", "n1", "n2"]
        index.touch(())
        entry, wkey, skey = index.where["n1"]
        index.whole[wkey].remove(entry)    # the index forgets n1: the gang no longer sees it
        assert sorted(GangCapacities(log.state.nodes, POOL, DEFAULT_LEVELS, statement.views).capacities(res)) == ["n0", "n2"]


# Between two cycles: (how many of the cycle's decisions are applied, a node cordoned or
# uncordoned (index, cordon) or None, more gangs arriving).
between = st.tuples(st.integers(0, 3), st.none() | st.tuples(st.integers(0, 11), st.booleans()),
                    st.lists(job, max_size=3))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(cluster_node, min_size=2, max_size=12), st.lists(job, min_size=1, max_size=8),
       st.lists(between, min_size=1, max_size=4))
def test_cycles_that_keep_gang_capacities_decide_as_cycles_that_keep_nothing(nodes, jobs, rounds):
    """Capacities kept from one cycle to the next (with the placement indexes) are those
    of the state at the next cycle's start: the same decisions as a cycle that reads them
    afresh, after some decisions applied, cordons and new gangs between the cycles."""
    log = build(nodes)
    submit(log, jobs)
    config = SchedulerConfig(placement="best-fit", reserve_after_s=0.0, default_estimate_s=100.0)
    keeping, fresh, memory = Scheduler(config), Scheduler(config), CycleMemory()
    for r, (apply, cordon, arriving) in enumerate(rounds):
        now = log.now
        kept = keeping.schedule(log.state, now, memory)
        assert decided(kept) == decided(fresh.schedule(log.state, now, CycleMemory()))
        for d in kept.decisions[:apply]:
            assert log(ev.JobPlaced, job_id=d.job_id, attempt=d.attempt, workers=d.workers).accepted
        if cordon is not None and cordon[0] < len(nodes):
            log(ev.NodeCordoned if cordon[1] else ev.NodeUncordoned, node=f"n{cordon[0]}")
        submit(log, arriving, prefix=f"r{r}-")
    assert memory.indexes.indexes


def decided(result) -> list:
    return sorted((d.job_id, d.workers) for d in result.decisions)


def test_past_its_bound_of_changes_a_shape_is_read_afresh():
    """More changes noted than the pool has nodes (and some): the kept shapes are dropped,
    not left without the changes they did not read."""
    log = build([(8, MODELS[0], 0, 0, False, None, 0, 0, 64_000)] * 3)
    res = make_spec(workers=2, gpus=8).resources
    view = GangCapacities(log.state.nodes, POOL, DEFAULT_LEVELS)
    assert sorted(view.capacities(res)) == ["n0", "n1", "n2"]
    view.capacities(make_spec(workers=2, gpus=4).resources)   # another shape, up to date too
    assert log.submit("busy", make_spec(gpus=8, cpu=0, mem=0)).accepted
    assert log.place("busy", ("n1", whole(*range(8)))).accepted
    view.touch(["n1"] + ["n0"] * (len(view.seq) + 1024))
    assert view.changed == [] and view.shapes == {}
    assert sorted(view.capacities(res)) == ["n0", "n2"]
