"""A gang's capacities read only the nodes the statement's ``FreeIndex`` lists with enough
free whole GPUs (``topology.GangCapacities``): the same gangs on the same nodes and GPUs
as the full computation over every node of the pool, on random clusters (racks, spines,
two GPU models, cordoned nodes, unhealthy GPUs, busy GPUs and shares), after bookings
of the same statement."""
from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings, strategies as st

from gpusched.core import events as ev
from gpusched.policies.placement.gang import place_gang
from gpusched.policies.placement.heuristics import free_index
from gpusched.policies.placement.registry import make_placement
from gpusched.policies.placement.topology import GangCapacities
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


def submit(log: Log, jobs: list[tuple]) -> list[str]:
    ids = []
    for i, (workers, gpus, milli, models, cpu) in enumerate(jobs):
        spec = make_spec(workers=workers, gpus=0 if milli else gpus, milli=milli, models=models, cpu=cpu, mem=1000)
        assert log.submit(f"j{i}", spec).accepted
        ids.append(f"j{i}")
    return ids


def placements(log: Log, ids: list[str], indexed: bool) -> list:
    """Each job's workers as placed in one statement, in order; ``indexed``: gangs read
    the free-capacity index, else every node (the full computation)."""
    state, policy, out = log.state, make_placement("best-fit"), []
    with tentative(state) as statement:
        if indexed:
            free_index(statement, state, POOL)
        else:
            statement.views[("gang", POOL)] = GangCapacities(state.nodes, POOL)   # no index to read
        for job_id in ids:
            job = state.jobs[job_id]
            placed = place_gang(state, job, policy, statement)
            out.append(None if placed is None else [(w.node, tuple((s.index, s.milli) for s in w.gpus))
                                                    for w in placed])
            gangs = statement.views.get(("gang", POOL))
            if indexed and gangs is not None:   # the kept capacities are the full ones, too
                res = job.spec.resources
                assert gangs.capacities(res) == GangCapacities(state.nodes, POOL).capacities(res)
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
        assert sorted(GangCapacities(log.state.nodes, POOL, statement.views).capacities(res)) == ["n0", "n1", "n2"]
        index.touch(())
        entry, wkey, skey = index.where["n1"]
        index.whole[wkey].remove(entry)    # the index forgets n1: the gang no longer sees it
        assert sorted(GangCapacities(log.state.nodes, POOL, statement.views).capacities(res)) == ["n0", "n2"]
