"""The preemptor's placer questions under FGD (``preemption.placer_views``) weigh
fragmentation by the pool's real mix of waiting and running jobs, as the placer's own
cycle does: asked on the hand-built clusters of the FGD tests, where the mix decides the
node, the preemptor's question answers what the placer chooses, with a call open (its
views kept between calls) and with none; and the node a preemption plans for its
beneficiary (its nomination) is the one the placer then gives it."""
from __future__ import annotations

import pytest

from gpusched.core.digest import digest
from gpusched.core.state import ClusterState
from gpusched.policies.placement.fgd.fragmentation import POPULARITY
from gpusched.policies.placement.fgd.task_mix import pool_mix, typical_shapes
from gpusched.policies.placement.kept_index import KeptIndexes
from gpusched.policies.placement.registry import make_placement
from gpusched.policies.statement import Statement, lend, tentative
from tests.unit.policies.placement_cases import build, choose
from tests.unit.policies.preemption.placer_questions import ask, planned_nodes
from tests.unit.policies.fgd_cases import CASES
from tests.unit.policies.preemption_clusters import BE, HI, NOW, Cluster

# The cases whose node the mix decides: with no mix every candidate scores alike and the
# first registered wins (``equal growth``), so there the answers could not differ.
MIXED = [case for case in CASES if case.expect is not None and case.expect != case.nodes[0].name]


@pytest.mark.parametrize("path", ["open", "closed"])
@pytest.mark.parametrize("policy", ["fgd", "fgd-lookahead"])
@pytest.mark.parametrize("case", MIXED, ids=str)
def test_the_preemptors_question_answers_the_placers_choice(case, policy, path):
    state = build(case).state
    before = digest(state)
    assert ask(state, policy, path) == choose(case, policy)
    assert digest(state) == before


def test_the_cases_are_ones_the_mix_decides():
    assert len(MIXED) >= 4
    for case in MIXED:
        assert choose(case, "fgd")[0] == case.expect != case.nodes[0].name


@pytest.mark.parametrize("policy", ["fgd", "fgd-lookahead"])
def test_the_planned_node_is_the_one_the_placer_gives_after_the_preemption(policy):
    # One victim frees a GPU on each node. n2's CPU is short of the mix's 8 cores, so its
    # free GPU is useless to the waiting jobs: FGD takes it and keeps n1's GPU for them.
    # With no mix both score alike and n1 (registered first) would be planned.
    c = Cluster(nodes=2, gpus=4)
    c.running("v", ("n1", (3,)), ("n2", (3,)), priority_class=BE, cpu=1000)
    c.running("k1", ("n1", (0, 1, 2)), priority_class=HI, cpu=1000)
    c.running("k2", ("n2", (0, 1, 2)), priority_class=HI, cpu=16_000 - 2000 - 3000)
    for i in range(100):
        c.pending(f"t{i}", gpus=1, cpu=8000, priority_class=BE, at=NOW - 1)
    c.pending("job", gpus=1, cpu=1000, priority_class=HI, at=NOW - 100)
    assert planned_nodes(c, policy) == ["n2"]


@pytest.mark.parametrize("kept", [False, True])
def test_the_mix_lent_is_counted_at_the_lending_not_after_the_scratch_changed_the_nodes(kept):
    # The call's scratch may release victims before a pool's first FGD question (one for a
    # MIG job, which FGD places without the mix): the mix is still the log state's.
    c = Cluster(nodes=1, gpus=4)
    c.running("v", ("n1", (0, 1)), priority_class=BE)
    c.pending("t", gpus=1, priority_class=BE)
    state = c.state
    log_mix = typical_shapes(state, "default")
    statement = Statement(ClusterState(nodes=state.nodes))
    if kept:
        KeptIndexes().install(state, statement)
    lend(statement, state, make_placement("fgd"))
    with tentative(state) as scratch:
        scratch.release(state.jobs["v"])
        assert typical_shapes(state, "default") != log_mix
        assert pool_mix(statement.state, statement, "default", POPULARITY) == log_mix
