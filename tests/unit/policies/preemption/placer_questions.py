"""The preemptor's placer questions as the tests of the policies that read the state's
jobs ask them (``test_preemption_fgd_mix``, ``test_preemption_clustering_tags``): one
question, and a preemption's planned node checked against the placer's choice."""
from __future__ import annotations

from gpusched.policies.placement.gang import place_gang
from gpusched.policies.placement.kept_index import KeptIndexes
from gpusched.policies.placement.registry import make_placement
from gpusched.policies.preemption.placer_views import PlacerViews
from gpusched.policies.preemption.slot_counts import ScratchChanges
from gpusched.policies.preemption.victim_rules import PreemptionConfig
from gpusched.policies.statement import tentative
from tests.unit.policies import preemption_oracle
from tests.unit.policies.preemption_clusters import NOW, Cluster
from tests.unit.policies.preemption_configs import other_rules


def ask(state, policy: str, path: str):
    """The preemptor's answer for the pending ``job``: inside a call (``SearchContext.
    tentative``'s order: scratch, then the placer's statement) or with none open."""
    score = make_placement(policy)
    touched = ScratchChanges()
    views = PlacerViews(state, touched, KeptIndexes(), score)
    if path == "closed":
        placed = views.place(state.jobs["job"], score)
    else:
        with tentative(state) as scratch:
            scratch.views[ScratchChanges] = touched
            views.open()
            try:
                placed = views.place(state.jobs["job"], score)
            finally:
                views.close()
    return None if placed is None else (placed[0].node, tuple(s.index for s in placed[0].gpus))


def planned_nodes(c: Cluster, policy: str) -> list[str]:
    """The nodes the one preemption for the pending ``job`` (its victim ``v``, decided as
    the oracle decides) plans for it: the ones the placer gives ``job`` once ``v`` is gone."""
    config = other_rules(placement=policy)
    decisions = c.decisions(config)
    assert decisions == preemption_oracle.preemption_decisions(c.state, NOW, config)
    [decision] = [d for d in decisions if d.for_job == "job"]
    assert decision.victims == ("v",)
    c.preempt(decision)
    with tentative(c.state) as statement:
        placed = place_gang(c.state, c.job("job"), make_placement(policy), statement)
    nodes = [w.node for w in placed]
    assert nodes == list(decision.planned_nodes)
    return nodes
