"""The simulator's topology (``gpusched.sim.topology``): the labels it gives nodes, what
gangs ask for, how compact their placements are counted, and a guard that the gang planner
keeps gangs inside one block more often once the pool declares its levels."""
from __future__ import annotations

from dataclasses import replace

import pytest

from gpusched.core.model import JobSpec, TopologyRequest, WorkerResources
from gpusched.sim import dynamic
from gpusched.sim.metrics import JobRecord
from gpusched.sim.synthetic import synthetic_workload
from gpusched.sim.topology import (
    LEVELS, GangPlacement, compactness, domain_paths, gang_request, label_nodes, multi_node, valid_pair,
    with_topology, within_one)
from gpusched.sim.workload import gpu_node

# Two racks of two blocks of two nodes; block names repeat across racks, as real
# labels may: a block is its rack's and its own label together.
NODES = tuple(replace(gpu_node(name, "H100-80GB", 8, 128_000, 1_048_576), labels=(("rack", rack), ("block", block)))
              for name, rack, block in [("a0", "r0", "b0"), ("a1", "r0", "b0"), ("a2", "r0", "b1"),
                                        ("a3", "r0", "b1"), ("c0", "r1", "b0"), ("c1", "r1", "b0"),
                                        ("c2", "r1", "b1"), ("c3", "r1", "b1")])
PATHS = domain_paths(NODES)


@pytest.mark.parametrize("nodes, one_rack, one_block", [
    (("a0", "a1"), True, True),              # one block
    (("a0", "a0", "a1"), True, True),        # two workers on one node, still one block
    (("a1", "a2"), True, False),             # two blocks of one rack
    (("a0", "c0"), False, False),            # blocks named alike in two racks: two blocks
    (("a0", "a1", "a2", "a3"), True, False),
    (("c2", "c3", "c2"), True, True),
    (("a3", "c2"), False, False),
])
def test_within_one_domain_of_each_level(nodes, one_rack, one_block):
    assert within_one(GangPlacement("j", 1, 16.0, nodes), PATHS) == (one_rack, one_block)


def _job(job_id: str, gpus: int, waited: float | None) -> JobRecord:
    return JobRecord(job_id, "t", gpus * 1000, max(1, gpus // 8), 0.0, waited,
                     None if waited is None else waited + 60.0)


def test_compactness_counts_every_placement_and_waits_by_size():
    jobs = [_job("g16a", 16, 10.0), _job("g16b", 16, 30.0), _job("g32", 32, 100.0), _job("g32never", 32, None),
            _job("one", 8, 5.0), _job("two", 1, 7.0)]
    placements = [GangPlacement("g16a", 1, 16.0, ("a0", "a1")),       # one block
                  GangPlacement("g16b", 1, 16.0, ("a1", "a2")),       # one rack, two blocks
                  GangPlacement("g32", 1, 32.0, ("a0", "a1", "a2", "c0")),   # preempted: two racks
                  GangPlacement("g32", 2, 32.0, ("c0", "c1", "c2", "c3"))]   # then one rack
    got = compactness(placements, PATHS, LEVELS, jobs, {"g16a", "g16b", "g32", "g32never"})
    assert (got["gangs"], got["placements"]) == (4, 4)
    assert got["within_one_rack"] == pytest.approx(3 / 4)
    assert got["within_one_block"] == pytest.approx(1 / 4)
    g16, g32 = got["by_size"]["16"], got["by_size"]["32"]
    assert (g16["jobs"], g16["placements"], g16["within_one_block"], g16["within_one_rack"]) == (2, 2, 0.5, 1.0)
    assert (g32["jobs"], g32["placements"], g32["within_one_block"], g32["within_one_rack"]) == (2, 2, 0.0, 0.5)
    assert g16["wait_s"]["mean"] == pytest.approx(20.0) and g16["never_ran"] == 0
    assert g32["wait_s"]["mean"] == pytest.approx(100.0) and g32["never_ran"] == 1
    assert got["other_jobs_wait_s"]["mean"] == pytest.approx(6.0)
    assert list(got["by_size"]) == ["16", "32"]


def test_no_gang_placed_no_share():
    got = compactness([], PATHS, LEVELS, [_job("one", 1, 1.0)], set())
    assert got["within_one_block"] is None and got["by_size"] == {}


def test_nodes_are_labelled_in_blocks_and_racks():
    nodes = tuple(gpu_node(f"n{i}", "H100-80GB", 8, 128_000, 1_048_576) for i in range(20))
    labelled = label_nodes(nodes, 2, 3)   # blocks of 2 nodes, racks of 3 blocks: 6 nodes a rack
    paths = domain_paths(labelled)
    assert paths["n0"] == paths["n1"] == ("r0", "r0-b0")
    assert paths["n5"] == ("r0", "r0-b2")
    assert paths["n6"] == ("r1", "r1-b0")
    assert paths["n19"] == ("r3", "r3-b0")
    assert len(set(paths.values())) == 10   # every block a domain path of its own


def test_gangs_ask_what_they_can_get():
    nodes = label_nodes(tuple(gpu_node(f"n{i}", "H100-80GB", 8, 128_000, 1_048_576) for i in range(8)), 2, 2)

    def gang(gpus: int, per_worker: int = 8) -> JobSpec:
        return JobSpec(name=f"g{gpus}", team="t", workers=gpus // per_worker,
                       resources=WorkerResources(gpus=per_worker))
    assert not multi_node(gang(8), nodes)
    assert not multi_node(gang(8, 4), nodes)                      # two workers, one node holds both
    assert multi_node(gang(16), nodes) and multi_node(gang(16, 4), nodes)
    assert gang_request(gang(16), nodes, "preferred-block") == TopologyRequest(preferred="block")
    assert gang_request(gang(32), nodes, "required-rack") == TopologyRequest(required="rack")   # 4 nodes a rack
    assert gang_request(gang(40), nodes, "required-rack") == TopologyRequest()   # no rack holds it: no request
    assert gang_request(gang(8), nodes, "required-rack") == TopologyRequest()    # one node: no gang
    assert valid_pair("default", "required-rack") and not valid_pair("default", "preferred-block")


def test_with_topology_declares_levels_or_not():
    wl = synthetic_workload(0, 3600, h100_nodes=8, l40s_nodes=0, flood_jobs=0)
    declared = with_topology(wl, 4, 2, "declared", "preferred-block")
    assert declared.pool_levels == (("default", LEVELS),) and declared.topology == LEVELS
    asked = {a.job_id for a in declared.arrivals if a.spec.topology.preferred == "block"}
    assert asked == {a.job_id for a in wl.arrivals if a.spec.workers > 1}
    assert with_topology(wl, 4, 2, "default", "none").pool_levels == ()


def test_the_command_runs_each_pair_the_pool_can_honour():
    wl = synthetic_workload(0, 3600, h100_nodes=8, l40s_nodes=0, flood_jobs=0)
    args = dynamic.build_parser().parse_args(["--topology", "4,2", "--topology-levels", "default,declared",
                                              "--gang-topology", "none,preferred-block"])
    runs = dynamic.topologies_of(args, wl)
    assert [name for name, _ in runs] == ["default/none", "declared/none", "declared/preferred-block"]
    assert [run.pool_levels for _, run in runs] == [(), (("default", LEVELS),), (("default", LEVELS),)]
    assert dynamic.topologies_of(dynamic.build_parser().parse_args([]), wl) == [(None, wl)]
    assert dynamic.figures_name(args, wl) == "dynamic-synthetic-s0-topology"

def _share_one_block(levels: str) -> tuple[float, int]:
    args = dynamic.build_parser().parse_args(["--horizon-h", GUARD_HORIZON_H, "--configs", "defaults+quotas",
                                              "--topology", "4,4", "--topology-levels", levels])
    _, [summary] = dynamic.run_configs(args, dynamic.workload_of(args))
    return summary["topology"]["within_one_block"], summary["topology"]["placements"]


GUARD_HORIZON_H = "8"


def test_declared_levels_keep_gangs_in_one_block_more_often():
    """With the pool's levels declared, the gang planner sees blocks and keeps gangs inside
    one more often than today's placement, which sees racks only: fails if the planner
    ignores the declared levels."""
    today, placed = _share_one_block("default")
    declared, placed_declared = _share_one_block("declared")
    assert min(placed, placed_declared) >= 10
    assert declared >= today + 0.1, (today, declared)
