"""Gangs in a pool's declared topology levels: the deepest domain that takes the gang,
a required level never crossed, a preferred level counted first, slices never split,
and the reducer refusing a placement that breaks the request."""
from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings, strategies as st

from gpusched.core import events as ev
from gpusched.core.model import TopologyRequest, TopologySlice, WorkerAssignment
from gpusched.core.topology import domain_path
from gpusched.policies.placement.gang import place_gang
from gpusched.policies.placement.registry import make_placement
from gpusched.policies.statement import tentative
from tests.unit.core.builders import Log, make_spec, whole
from tests.unit.policies.placement_cases import node

LEVELS = ("rack", "block")


def host(name: str, rack: str, block: str, gpus: int = 8):
    return node(name, gpus=gpus, cpu=128_000, mem=1_000_000, labels=(("rack", rack), ("block", block)))


def cluster(*nodes, levels=LEVELS) -> Log:
    log = Log(*nodes)
    assert log(ev.PoolTopologySet, pool="default", levels=levels).accepted
    return log


def busy(log: Log, used: dict[str, int]) -> None:
    for i, (name, gpus) in enumerate(used.items()):
        assert log.submit(f"busy{i}", make_spec("busy", gpus=gpus, cpu=0, mem=0)).accepted
        assert log.place(f"busy{i}", (name, whole(*range(gpus)))).accepted


def plan(log: Log, workers: int, gpus: int = 8, policy: str = "best-fit", **request) -> list[str] | None:
    """The nodes of each worker, in worker order, or None."""
    spec = replace(make_spec(workers=workers, gpus=gpus, cpu=1000, mem=1000), topology=TopologyRequest(**request))
    job_id = f"gang{len(log.state.jobs)}"
    assert log.submit(job_id, spec).accepted
    with tentative(log.state) as statement:
        placed = place_gang(log.state, log.state.jobs[job_id], make_placement(policy), statement)
    if placed is None:
        return None
    assert [w.worker for w in placed] == list(range(workers))
    return [w.node for w in placed]


def racks_and_blocks(rack_blocks: dict[str, dict[str, int]]) -> list:
    """{rack: {block: nodes}} -> hosts named rack-block-i, registered in that order."""
    return [host(f"{r}-{b}-{i}", r, b) for r, blocks in rack_blocks.items() for b, n in blocks.items()
            for i in range(n)]


def test_the_gang_goes_to_the_one_block_that_takes_it_not_across_blocks_of_a_rack():
    log = cluster(*racks_and_blocks({"r1": {"b1": 2, "b2": 2}, "r2": {"b3": 4}}))
    assert sorted(set(plan(log, 4))) == ["r2-b3-0", "r2-b3-1", "r2-b3-2", "r2-b3-3"]


def test_today_levels_see_only_racks():
    """Without declared levels the pool has spine and rack: both racks take the gang, the
    block label means nothing, and the rack needing fewer nodes, then the fuller, wins."""
    log = Log(*racks_and_blocks({"r1": {"b1": 2, "b2": 2}, "r2": {"b3": 4, "b4": 1}}))
    assert sorted(set(plan(log, 4))) == ["r1-b1-0", "r1-b1-1", "r1-b2-0", "r1-b2-1"]


def test_small_gangs_go_to_the_broken_domain_keeping_the_whole_one_free():
    log = cluster(*racks_and_blocks({"r1": {"b1": 4, "b2": 4}}))
    busy(log, {"r1-b2-0": 8, "r1-b2-1": 8})
    assert sorted(set(plan(log, 2))) == ["r1-b2-2", "r1-b2-3"]


def test_required_rack_waits_rather_than_cross_racks():
    log = cluster(*racks_and_blocks({"r1": {"b1": 2}, "r2": {"b2": 2}}))
    assert plan(log, 3, required="rack") is None
    assert len(plan(log, 3)) == 3            # without the requirement it spans the two racks
    assert {n[:2] for n in plan(log, 2, required="rack")} == {"r1"}


def test_required_rack_spreads_over_the_racks_blocks():
    log = cluster(*racks_and_blocks({"r1": {"b1": 2, "b2": 2}, "r2": {"b3": 3}}))
    busy(log, {"r2-b3-0": 8})
    placed = plan(log, 4, required="rack")
    assert {n[:2] for n in placed} == {"r1"}


def test_preferred_block_counts_blocks_before_racks():
    """8 nodes: rack r1 holds them in three blocks (3+3+2), racks r2 and r3 hold one whole
    block of 4 each. Fewest racks (the default) takes r1's three blocks; preferring blocks
    takes the two blocks of r2 and r3."""
    log = cluster(*racks_and_blocks({"r1": {"b1": 3, "b2": 3, "b3": 2}, "r2": {"b4": 4}, "r3": {"b5": 4}}))
    assert {n[:2] for n in plan(log, 8)} == {"r1"}
    assert {n[:5] for n in plan(log, 8, preferred="block")} == {"r2-b4", "r3-b5"}


def test_a_slice_is_never_split_even_where_the_gang_must_spread():
    """Two blocks of 3 free nodes each take 6 workers, but slices of 4 need a block each
    holding 4: the gang waits; blocks of 4 take it, each slice in one block."""
    log = cluster(*racks_and_blocks({"r1": {"b1": 3, "b2": 3}}))
    assert plan(log, 4, slice=TopologySlice("block", 4)) is None
    assert len(plan(log, 4)) == 4
    log = cluster(*racks_and_blocks({"r1": {"b1": 3, "b2": 5}, "r2": {"b3": 4}}))
    placed = plan(log, 8, slice=TopologySlice("block", 4))
    assert len({n[:5] for n in placed[:4]}) == 1 and len({n[:5] for n in placed[4:]}) == 1


def test_a_level_the_pool_no_longer_has_holds_a_required_gang():
    log = cluster(*racks_and_blocks({"r1": {"b1": 2}}))
    assert log.submit("g", replace(make_spec(workers=2, gpus=8), topology=TopologyRequest(required="block"))).accepted
    assert log(ev.PoolTopologySet, pool="default", levels=("rack",)).accepted
    with tentative(log.state) as statement:
        assert place_gang(log.state, log.state.jobs["g"], make_placement("best-fit"), statement) is None


def test_the_reducer_refuses_a_placement_across_a_required_rack_or_splitting_a_slice():
    log = cluster(*racks_and_blocks({"r1": {"b1": 1, "b2": 1}, "r2": {"b3": 1}}))
    spec = replace(make_spec(workers=2, gpus=8), topology=TopologyRequest(required="rack"))
    assert log.submit("g", spec).accepted
    assert not log.place("g", ("r1-b1-0", whole(*range(8))), ("r2-b3-0", whole(*range(8)))).accepted
    spec = replace(spec, topology=TopologyRequest(slice=TopologySlice("block", 2)))
    assert log.submit("s", spec).accepted
    assert not log.place("s", ("r1-b1-0", whole(*range(8))), ("r1-b2-0", whole(*range(8)))).accepted
    assert log.place("g", ("r1-b1-0", whole(*range(8))), ("r1-b2-0", whole(*range(8)))).accepted


# --- properties ---------------------------------------------------------------------------
hosts_st = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2), st.sampled_from([4, 8]), st.integers(0, 8)),
                    min_size=1, max_size=14)
request_st = st.fixed_dictionaries({}, optional={
    "required": st.sampled_from(["rack", "block"]),
    "preferred": st.just("block"),
    "slice": st.sampled_from([TopologySlice("block", 2), TopologySlice("rack", 2), TopologySlice("block", 4)]),
})


@settings(max_examples=150, deadline=None)
@given(hosts=hosts_st, workers=st.sampled_from([2, 4, 6, 8]), gpus=st.sampled_from([2, 4, 8]), request=request_st,
       policy=st.sampled_from(["best-fit", "fgd"]))
def test_a_plan_keeps_every_request_and_required_gangs_wait_only_when_no_domain_takes_them(
        hosts, workers, gpus, request, policy):
    if request.get("required") == "block" and request.get("preferred") == "block":
        request.pop("preferred")
    if "slice" in request and (workers % request["slice"].workers or
                               (request.get("required") == "block" and request["slice"].level == "rack")):
        request.pop("slice")
    infos = [host(f"n{i}", f"r{r}", f"b{b}", gpus=g) for i, (r, b, g, _) in enumerate(hosts)]
    log = cluster(*infos)
    busy(log, {f"n{i}": min(used, g) for i, (_, _, g, used) in enumerate(hosts) if min(used, g)})
    placed = plan(log, workers, gpus, policy, **request)
    nodes = {n.name: n.info for n in log.state.nodes.values()}
    path = {name: domain_path(info, LEVELS) for name, info in nodes.items()}
    free = {n.name: n.free_whole_gpus() // gpus for n in log.state.nodes.values()}
    if placed is not None:
        assert len(placed) == workers
        if "required" in request:
            cut = LEVELS.index(request["required"]) + 1
            assert len({path[n][:cut] for n in placed}) == 1
        if "slice" in request:
            s = request["slice"]
            cut = LEVELS.index(s.level) + 1
            for start in range(0, workers, s.workers):
                assert len({path[n][:cut] for n in placed[start:start + s.workers]}) == 1
        workers_at = [WorkerAssignment(i, n, ()) for i, n in enumerate(placed)]
        from gpusched.core.topology import placement_violation
        assert placement_violation(log.state.jobs[f"gang{len(log.state.jobs) - 1}"].spec, nodes, LEVELS,
                                   workers_at) == ""
    elif "required" in request and "slice" not in request:
        cut = LEVELS.index(request["required"]) + 1
        held: dict[tuple, int] = {}
        for name, n in free.items():
            held[path[name][:cut]] = held.get(path[name][:cut], 0) + n
        assert max(held.values()) < workers   # no domain of the level could take it
    elif not request:
        assert sum(free.values()) < workers


# --- why pending -----------------------------------------------------------------------------
def why(log: Log, job_id: str):
    from gpusched.policies.memory import CycleMemory
    from gpusched.policies.placement.diagnosis import diagnose
    return diagnose(log.state, log.state.jobs[job_id], 0.0, CycleMemory())


def test_why_pending_names_the_level_and_the_domains_that_came_closest():
    log = cluster(*racks_and_blocks({"r1": {"b1": 2, "b2": 1}, "r2": {"b3": 2}, "r3": {"b4": 1}}))
    spec = replace(make_spec(workers=4, gpus=8), topology=TopologyRequest(required="rack"))
    assert log.submit("g", spec).accepted
    reason = why(log, "g")
    assert reason.kind.value == "topology"
    assert "no rack has room for 4 workers" in reason.summary
    assert "3 racks with room; closest: r1 with room for 3, r2 with room for 2, r3 with room for 1 workers" \
        in reason.summary
    assert log.submit("s", replace(spec, topology=TopologyRequest(slice=TopologySlice("block", 4)))).accepted
    assert "slices of 4 workers, each inside one block: no block has room for 1 slice (" in why(log, "s").summary
    assert log.submit("free", replace(spec, topology=TopologyRequest(required="rack"), workers=3)).accepted
    assert why(log, "free").kind.value == "queued"


# --- preemption --------------------------------------------------------------------------
def test_preemption_for_a_gang_requiring_a_rack_takes_its_victims_inside_one_rack():
    """The cheapest victims (best-effort, one per rack) would free room in two racks; the
    gang requires one, so the victims are a rack's two jobs, and the gang then fits."""
    from gpusched.policies.memory import CycleMemory
    from gpusched.policies.preemption.decisions import victims_for
    from tests.unit.policies.preemption_clusters import BE, NOW, PROD, TR, Cluster
    from tests.unit.policies.preemption_configs import other_rules

    c = Cluster(nodes=0)
    c.log = cluster(host("n1", "r1", "b1"), host("n2", "r1", "b1"), host("n3", "r2", "b2"), host("n4", "r2", "b2"))
    c.state = c.log.state
    for job_id, where, klass in (("be1", "n1", BE), ("tr2", "n2", TR), ("be3", "n3", BE), ("tr4", "n4", TR)):
        c.running(job_id, (where, tuple(range(8))), priority_class=klass)
    spec = replace(make_spec(name="gang", workers=2, gpus=8, cpu=0, mem=0, priority_class=PROD),
                   topology=TopologyRequest(required="rack"))
    free = replace(spec, topology=TopologyRequest())
    assert c.log(ev.JobSubmitted, job_id="free", spec=free, time=NOW - 5).accepted
    assert sorted(victims_for(c.state, c.job("free"), NOW, CycleMemory(), other_rules())) == ["be1", "be3"]
    assert c.log(ev.JobCancelled, job_id="free", time=NOW - 4).accepted
    assert c.log(ev.JobSubmitted, job_id="gang", spec=spec, time=NOW - 5).accepted
    victims = c.victims("gang")
    assert victims is not None and sorted(victims) in (["be1", "tr2"], ["be3", "tr4"])
    (decision,) = c.decisions()
    c.preempt(decision)
    assert c.placeable("gang")


@pytest.mark.parametrize("policy", ["best-fit", "fgd"])
def test_a_one_worker_job_goes_to_a_domain_in_use_keeping_untouched_blocks_whole(policy):
    hosts = [host("n3", "r1", "b2"), host("n4", "r1", "b2"), host("n1", "r1", "b1"), host("n2", "r1", "b1")]
    log = cluster(*hosts)
    busy(log, {"n1": 8})
    assert plan(log, 1, policy=policy) == ["n2"]
    today = Log(*hosts)
    busy(today, {"n1": 8})
    assert plan(today, 1, policy=policy) == ["n3"]     # without declared levels: the policy's choice


# --- the production cycle ------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(hosts=hosts_st, gangs=st.lists(st.tuples(st.sampled_from([2, 4]), st.sampled_from([4, 8]), request_st),
                                      min_size=1, max_size=6),
       queue=st.sampled_from(["fifo", "fair-share"]))
def test_a_cycle_places_gangs_only_as_they_ask_and_leaves_the_state_as_it_was(hosts, gangs, queue):
    """Random labelled clusters and gangs with and without requests: every decision of the
    production scheduler's cycle keeps its job's request, the reducer accepts every one,
    and the cycle's tentative bookings are all rolled back."""
    from gpusched.core.digest import digest
    from gpusched.policies.memory import CycleMemory
    from gpusched.policies.scheduler import Scheduler, SchedulerConfig

    log = cluster(*(host(f"n{i}", f"r{r}", f"b{b}", gpus=g) for i, (r, b, g, _) in enumerate(hosts)))
    busy(log, {f"n{i}": min(used, g) for i, (_, _, g, used) in enumerate(hosts) if min(used, g)})
    for i, (workers, gpus, request) in enumerate(gangs):
        request = dict(request)
        if request.get("required") == "block":
            request.pop("preferred", None)
            if request.get("slice", TopologySlice()).level == "rack":
                request.pop("slice")
        if "slice" in request and workers % request["slice"].workers:
            request.pop("slice")
        spec = replace(make_spec(workers=workers, gpus=gpus, cpu=1000, mem=1000), topology=TopologyRequest(**request))
        assert log.submit(f"g{i}", spec).accepted
    before = digest(log.state)
    decisions = Scheduler(SchedulerConfig(queue=queue)).cycle(log.state, 0.0, CycleMemory())
    assert digest(log.state) == before
    nodes = {n.name: n.info for n in log.state.nodes.values()}
    from gpusched.core.topology import placement_violation
    for d in decisions:
        job = log.state.jobs[d.job_id]
        assert placement_violation(job.spec, nodes, LEVELS, d.workers) == ""
        assert log.place(d.job_id, *((w.node, w.gpus) for w in sorted(d.workers, key=lambda w: w.worker))).accepted


# --- reservations ----------------------------------------------------------------------------
def test_a_reservation_for_a_gang_requiring_a_rack_is_inside_one_rack_or_none():
    """r1's two nodes free at 100 and 300, r2's one at 50: a 2-node gang without the
    requirement is reserved at 100 across racks; requiring a rack, at 300 inside r1; a
    3-node gang requiring a rack never fits, so nothing is reserved (and held) for it."""
    from gpusched.policies.reservation.backfill import reserve_for_head_of_line

    log = cluster(host("a0", "r1", "b1"), host("a1", "r1", "b1"), host("b0", "r2", "b2"))
    for name, runtime in (("a0", 100.0), ("a1", 300.0), ("b0", 50.0)):
        spec = replace(make_spec("busy", gpus=8, cpu=0, mem=0), max_runtime_s=runtime)
        assert log.submit(f"on-{name}", spec).accepted
        assert log.place(f"on-{name}", (name, whole(*range(8)))).accepted

    def reserve(workers: int, **request):
        spec = replace(make_spec(workers=workers, gpus=8, cpu=0, mem=0), topology=TopologyRequest(**request))
        job_id = f"g{len(log.state.jobs)}"
        assert log.submit(job_id, spec).accepted
        with tentative(log.state) as statement:
            found = reserve_for_head_of_line(statement, log.state.jobs[job_id], 0.0)
        return None if found is None else (found.shadow_s, sorted(w.node for w in found.workers))

    (loose, across), (racked, inside) = reserve(2), reserve(2, required="rack")
    assert across == ["a0", "b0"] and inside == ["a0", "a1"]
    ends = {name: log.state.jobs[f"on-{name}"].placed_at + log.state.jobs[f"on-{name}"].time_limit_s
            for name in ("a0", "a1")}
    assert (loose, racked) == (ends["a0"], ends["a1"])   # a1's end rather than a0's
    assert reserve(3, required="rack") is None
