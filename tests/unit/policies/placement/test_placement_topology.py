"""Gangs: all workers or none; fewest racks, then fewest nodes; a spine before crossing
spines."""
from __future__ import annotations

import pytest

from gpusched.core.digest import digest
from gpusched.policies.statement import tentative
from gpusched.policies.placement.gang import place_gang
from gpusched.policies.placement.registry import make_placement
from tests.unit.core.builders import Log, make_spec, whole
from tests.unit.policies.placement_cases import node


def rack(name: str, rack_name: str, spine: str = "s0", gpus: int = 8):
    return node(name, gpus=gpus, cpu=128_000, mem=1_000_000, labels=(("rack", rack_name), ("spine", spine)))


def gang(log: Log, workers: int, gpus: int, busy: dict[str, int] = {}) -> list[tuple[int, str, tuple[int, ...]]] | None:
    for i, (name, used) in enumerate(busy.items()):
        assert log.submit(f"busy{i}", make_spec("busy", gpus=used, cpu=0, mem=0)).accepted
        assert log.place(f"busy{i}", (name, whole(*range(used)))).accepted
    assert log.submit("gang", make_spec(workers=workers, gpus=gpus, cpu=1000, mem=1000)).accepted
    with tentative(log.state) as statement:
        placed = place_gang(log.state, log.state.jobs["gang"], make_placement("best-fit"), statement)
    return None if placed is None else [(w.worker, w.node, tuple(s.index for s in w.gpus)) for w in placed]


def nodes_of(placed) -> list[str]:
    return sorted({n for _, n, _ in placed})


CASES = [
    # (name, nodes, workers, GPUs per worker, busy GPUs per node, expected nodes)
    ("two workers share one 8-GPU node (NVLink) rather than two nodes",
     [rack("a1", "r1"), rack("a2", "r1")], 2, 4, {}, ["a1"]),
    ("one rack with room beats two racks",
     [rack("a1", "r1"), rack("b1", "r2"), rack("b2", "r2")], 2, 8, {}, ["b1", "b2"]),
    ("fewest nodes inside the rack: emptier nodes first",
     [rack("a1", "r1"), rack("a2", "r1"), rack("a3", "r1")], 3, 4, {"a1": 4, "a2": 6}, ["a1", "a3"]),
    ("the rack needing fewer nodes",
     [rack("a1", "r1"), rack("a2", "r1"), rack("b1", "r2")], 4, 2, {"a1": 4, "a2": 4}, ["b1"]),
    ("racks of one spine before crossing spines",
     [rack("a1", "r1", "s0"), rack("b1", "r2", "s1"), rack("c1", "r3", "s1"), rack("d1", "r4", "s0")],
     2, 8, {"d1": 8}, ["b1", "c1"]),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_gang_topology(case):
    _, nodes, workers, gpus, busy, expected = case
    placed = gang(Log(*nodes), workers, gpus, busy)
    assert placed is not None
    assert [w for w, _, _ in placed] == list(range(workers))
    assert all(len(g) == gpus for _, _, g in placed)
    assert nodes_of(placed) == expected


def test_gang_that_does_not_fit_takes_nothing():
    log = Log(rack("a1", "r1"), rack("a2", "r2"))
    assert gang(log, 3, 8, {}) is None     # 3 x 8 GPUs on 2 x 8: the first two would fit
    before = digest(log.state)
    assert log.state.jobs["gang"].phase.value == "pending"
    with tentative(log.state) as statement:
        assert place_gang(log.state, log.state.jobs["gang"], make_placement("best-fit"), statement) is None
        assert statement.checkpoint() == 0
    assert all(n.used_cpu == 0 and all(g.used_milli == 0 for g in n.gpus) for n in log.state.nodes.values())
    assert digest(log.state) == before


def placed_by(log: Log, policy: str, job_id: str = "gang") -> list[str]:
    with tentative(log.state) as statement:
        placed = place_gang(log.state, log.state.jobs[job_id], make_placement(policy), statement)
    assert placed is not None
    return [w.node for w in placed]


@pytest.mark.parametrize("policy", ["best-fit", "fgd", "fgd-lookahead"])
def test_the_policy_scores_a_gangs_nodes_among_those_topology_rates_alike(policy):
    """Two nodes of one rack take the whole gang each; the first registered is idle, the
    other has one GPU taken. Topology alone takes the first (registration order); the
    policy keeps the idle node whole for the 8-GPU job waiting (FGD: an 8-GPU node broken
    is all fragmentation; best-fit: the tightest node)."""
    log = Log(rack("idle", "r1"), rack("used", "r1"))
    assert log.submit("busy", make_spec("busy", gpus=1, cpu=0, mem=0)).accepted
    assert log.place("busy", ("used", whole(0))).accepted
    assert log.submit("big", make_spec("other", gpus=8, cpu=1000, mem=1000)).accepted
    assert log.submit("gang", make_spec(workers=2, gpus=1, cpu=1000, mem=1000)).accepted
    assert placed_by(log, policy) == ["used", "used"]


def test_fgd_orders_a_gangs_racks_by_fragmentation_where_topology_ties():
    """Two racks of one node each, both taking the gang on one node: FGD takes the rack
    whose node it fragments least, though it registered last."""
    log = Log(rack("a1", "r1"), rack("b1", "r2"))
    assert log.submit("busy", make_spec("busy", gpus=4, cpu=0, mem=0)).accepted
    assert log.place("busy", ("b1", whole(0, 1, 2, 3))).accepted
    for i in range(3):
        assert log.submit(f"big{i}", make_spec("other", gpus=8, cpu=1000, mem=1000)).accepted
    assert log.submit("gang", make_spec(workers=2, gpus=2, cpu=1000, mem=1000)).accepted
    assert placed_by(log, "fgd") == ["b1", "b1"]


@pytest.mark.parametrize("policy", sorted(__import__("gpusched.policies.placement.registry",
                                                     fromlist=["PLACEMENTS"]).PLACEMENTS))
@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_every_policy_keeps_a_gang_as_compact_as_topology_plans(case, policy):
    """The policy breaks ties only: as few racks and nodes as the topology-only plan."""
    _, nodes, workers, gpus, busy, expected = case
    log = Log(*nodes)
    gang(log, workers, gpus, busy)
    racks = {n.name: n.info.label("rack") for n in log.state.nodes.values()}
    got = placed_by(log, policy)
    assert len(set(got)) == len(expected)
    assert len({racks[n] for n in got}) == len({racks[n] for n in expected})
