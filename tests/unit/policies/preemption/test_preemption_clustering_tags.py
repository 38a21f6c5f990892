"""The preemptor's placer questions under gpu-clustering (``preemption.placer_views``)
read the node tags (the GPU shapes of the jobs on each node) from the state's jobs, as
the placer's own cycle does, though the placer's statement is on a copy holding the
nodes only: asked on the hand-built clusters of the baseline tests, where the tags decide
the node, the preemptor's question answers what the placer chooses, with a call open
(its views kept between calls or not) and with none, and changes nothing of the state."""
from __future__ import annotations

import pytest

from gpusched.core.digest import digest
from gpusched.core.state import ClusterState
from gpusched.policies.placement.gang import place_gang
from gpusched.policies.placement.registry import make_placement
from gpusched.policies.statement import tentative
from tests.unit.core.builders import make_spec, share, whole
from tests.unit.policies.placement_cases import Case, build, choose, node
from tests.unit.policies.preemption.placer_questions import ask, planned_nodes
from tests.unit.policies.clustering_cases import GPU_CLUSTERING
from tests.unit.policies.preemption_clusters import BE, HI, NOW, Cluster

POLICY = "gpu-clustering"
# Where the tags decide: seen without them every node is idle to the policy and the
# fuller node wins, which is not the one chosen here.
TAGGED = [
    GPU_CLUSTERING[2],
    Case("the node of the same shape though the other is fuller",
         [node("a"), node("b")], make_spec(gpus=1), "b", gpus=(1,),
         busy=[("a", share(0, 600), 0), ("a", share(1, 600), 0), ("b", whole(0), 0)]),
    Case("a mixed node with the shape beats a small idle one",
         [node("a", gpus=2), node("b")], make_spec(milli=300), "b", gpus=(1,),
         busy=[("b", whole(0), 0), ("b", share(1, 400), 0)]),
]


def without_tags(case: Case) -> str | None:
    """The node chosen on the nodes alone, no jobs: what the tags must overturn."""
    state = build(case).state
    view = ClusterState(nodes=state.nodes)
    with tentative(view) as statement:
        placed = place_gang(view, state.jobs["job"], make_placement(POLICY), statement)
    return None if placed is None else placed[0].node


@pytest.mark.parametrize("path", ["open", "closed"])
@pytest.mark.parametrize("case", GPU_CLUSTERING + TAGGED[1:], ids=str)
def test_the_preemptors_question_answers_the_placers_choice(case, path):
    state = build(case).state
    before = digest(state)
    assert ask(state, POLICY, path) == choose(case, POLICY)
    assert digest(state) == before


def test_the_cases_are_ones_the_tags_decide():
    for case in TAGGED:
        assert choose(case, POLICY)[0] == case.expect
        assert without_tags(case) not in (case.expect, None)


def test_the_planned_node_is_the_one_the_placer_gives_after_the_preemption():
    # One victim frees a GPU on each node, leaving them alike but for their tags: n2 runs
    # only 1-GPU jobs, the shape of the beneficiary, so the placer gives it n2. Seen
    # without tags both are idle alike and n1 (registered first) would be planned.
    c = Cluster(nodes=2, gpus=4)
    c.running("v", ("n1", (3,)), ("n2", (3,)), priority_class=BE)
    c.running("k1", ("n1", (0, 1, 2)), priority_class=HI)
    for i in range(3):
        c.running(f"k2{i}", ("n2", (i,)), priority_class=HI)
    c.pending("job", gpus=1, priority_class=HI, at=NOW - 100)
    assert planned_nodes(c, POLICY) == ["n2"]
