"""Defragmentation (gpusched.policies.preemption.defrag): move checkpointable jobs to consolidate."""
from __future__ import annotations

from gpusched.core import events as ev
from gpusched.core.model import JobPhase
from gpusched.policies.preemption.defrag import blocked_by_fragmentation
from gpusched.policies.preemption.decisions import preemption_events
from gpusched.policies.preemption.victim_rules import PreemptionConfig
from tests.unit.policies.defrag_clusters import NOW, BE, TR, HI, Cluster, fragmented


def test_fragmented_pool_gets_a_plan_whose_moved_jobs_fit_elsewhere():
    c = fragmented()
    assert blocked_by_fragmentation(c.state, c.state.jobs["big"])
    (d,) = c.decisions()
    assert d.for_job == "big" and d.reason == "defragmentation"
    assert d.victims == ("a",)           # least work at risk (60 s against 120 s)
    assert d.nodes == d.planned_nodes == ("n1",)   # n1 freed, and "big" planned there
    # Carry it out through the reducer: the moved job and the pending one both fit now.
    for e in preemption_events(c.state, d, NOW):
        assert c.log.replay(e).accepted
    assert c.state.jobs["a"].phase is JobPhase.PREEMPTING
    assert c.log(ev.WorkerFinished, job_id="a", attempt=0, worker=0, node="n1", exit_code=0, time=NOW).accepted
    assert c.state.jobs["a"].phase is JobPhase.PENDING
    assert c.fits("big", "a")
    # The nomination holds the plan: no second plan while it is in flight.
    assert c.decisions(now=NOW + 1) == []


def test_no_plan_when_the_moved_jobs_would_not_fit_elsewhere():
    c = Cluster(gpus=(8, 8))
    c.running("a", "n1", (0, 1, 2, 3, 4))      # 3 free on n1
    c.running("b", "n2", (0, 1, 2, 3, 4))      # 3 free on n2
    c.pending("six", gpus=6)
    assert blocked_by_fragmentation(c.state, c.state.jobs["six"])
    assert c.decisions() == []              # moving a 5-GPU job leaves it nowhere to go
    assert c.plan("six") is None


def test_no_plan_when_work_lost_exceeds_the_cap():
    c = fragmented()
    cfg = PreemptionConfig(defrag_max_work_lost_s=50)
    assert c.decisions(cfg) == []
    assert c.plan("big", PreemptionConfig(defrag_max_work_lost_s=100)) == ("a",)
    assert c.plan("big", PreemptionConfig(defrag_max_work_lost_s=59)) is None


def test_moves_are_capped_in_number():
    c = Cluster(gpus=(8, 8, 8))
    for i in range(4):
        c.running(f"a{i}", "n1", (i,), ckpt=NOW - 10)
    for i in range(4):
        c.running(f"b{i}", "n2", (i,), ckpt=NOW - 10)
    c.running("full", "n3", tuple(range(8)), preemptible=False)
    c.pending("big", gpus=8)
    assert c.plan("big", PreemptionConfig(defrag_max_moves=3)) is None
    assert len(c.plan("big", PreemptionConfig(defrag_max_moves=4))) == 4


def test_no_plan_when_capacity_is_short_overall():
    c = Cluster(gpus=(8, 8))
    c.running("a", "n1", (0, 1, 2, 3, 4))
    c.running("b", "n2", (0, 1, 2, 3, 4))
    c.pending("big", gpus=8)                # 6 free in all: not fragmentation
    assert not blocked_by_fragmentation(c.state, c.state.jobs["big"])
    assert c.decisions() == []


def test_only_checkpointable_preemptible_old_enough_not_higher_jobs_move():
    for kw in ({"ckpt_every": 0.0}, {"preemptible": False}, {"started": NOW - 10, "ckpt": None},
               {"priority_class": HI}):
        c = Cluster()
        c.running("a", "n1", (0, 1, 2, 3), **kw)
        c.running("b", "n2", (0, 1, 2, 3), **kw)
        c.running("full", "n3", tuple(range(8)), preemptible=False)
        c.pending("big", gpus=8)
        assert c.decisions() == [], kw
    c = Cluster()
    c.running("a", "n1", (0, 1, 2, 3), priority_class=BE)
    c.running("b", "n2", (0, 1, 2, 3), priority_class=HI, ckpt=NOW - 1)
    c.running("full", "n3", tuple(range(8)), preemptible=False)
    c.pending("big", gpus=8, priority_class=TR)
    assert c.plan("big") == ("a",)


def test_no_plan_when_the_job_fits_already():
    c = Cluster()
    c.running("a", "n1", (0, 1, 2, 3))
    c.pending("big", gpus=8)
    assert c.decisions() == [] and c.plan("big") is None


def test_two_pending_jobs_do_not_share_moves_or_holes():
    c = Cluster(gpus=(8, 8, 8, 8))
    c.running("a", "n1", (0, 1, 2, 3), ckpt=NOW - 10)
    c.running("b", "n2", (0, 1, 2, 3), ckpt=NOW - 20)
    c.running("c", "n3", (0, 1, 2, 3), ckpt=NOW - 30)
    c.running("d", "n4", (0, 1, 2, 3), ckpt=NOW - 40)
    c.pending("big1", gpus=8, at=NOW - 10)
    c.pending("big2", gpus=8, at=NOW - 9)
    decisions = c.decisions()
    assert [d.for_job for d in decisions] == ["big1", "big2"]
    moved = [v for d in decisions for v in d.victims]
    assert len(moved) == len(set(moved)) == 2
    for d in decisions:
        for e in preemption_events(c.state, d, NOW):
            assert c.log.replay(e).accepted
        for v in d.victims:
            assert c.log(ev.WorkerFinished, job_id=v, attempt=0, worker=0,
                         node=c.state.jobs[v].workers[0].node, exit_code=0, time=NOW).accepted
    assert c.fits("big1", "big2", *moved)


def test_gang_defragmentation():
    c = Cluster(gpus=(8, 8, 8, 8))
    c.running("a", "n1", (0, 1, 2, 3))
    c.running("b", "n2", (0, 1, 2, 3))
    c.running("c", "n3", (0, 1, 2, 3))
    c.running("d", "n4", (0, 1))
    c.pending("gang", gpus=8, workers=2)      # 4+4+4+6 = 18 free, no 8-GPU node
    victims = c.plan("gang")
    assert victims is not None and len(victims) == 2


def test_work_cap_is_on_the_sum_of_the_moved_jobs():
    c = Cluster(gpus=(8, 8, 8))
    for i in range(4):
        c.running(f"a{i}", "n1", (i,), ckpt=NOW - 200)
        c.running(f"b{i}", "n2", (i,), ckpt=NOW - 200)
    c.running("full", "n3", tuple(range(8)), preemptible=False)
    c.pending("big", gpus=8)
    # Each job risks 200 s, under the 600 s cap; the four that must move risk 800 s.
    assert c.plan("big") is None
    assert c.decisions() == []
    assert len(c.plan("big", PreemptionConfig(defrag_max_work_lost_s=800))) == 4


def test_a_plan_looks_at_the_nodes_by_work_at_risk_and_stops(monkeypatch):
    """Twenty nodes each with a hole of 4 GPUs beside a movable 4-GPU job, the jobs'
    work at risk growing with the node: the cheapest plan is read off the first node in
    order of work at risk, and (one plan tried) the search stops at the next, whose least
    work at risk is above the plan's; stepping every node plans the same."""
    from gpusched.policies.preemption.indexed_search import IndexedSearch
    from tests.unit.policies import preemption_oracle as oracle
    c = Cluster(gpus=(8,) * 20)
    for i in range(20):
        c.running(f"a{i}", f"n{i + 1}", (0, 1, 2, 3), ckpt=NOW - 10 * (20 - i))
    c.pending("big", gpus=8)
    looked: list[str] = []
    step = IndexedSearch.node_step
    monkeypatch.setattr(IndexedSearch, "node_step", lambda self, name: looked.append(name) or step(self, name))
    cfg = PreemptionConfig(defrag_max_plans=1)
    (d,) = c.decisions(cfg)
    assert d.victims == ("a19",) and looked == ["n20"]
    assert [d] == oracle.defrag_decisions(c.state, NOW, cfg)
    looked.clear()
    assert c.decisions(PreemptionConfig(defrag_max_plans=3)) == [d] and looked == ["n20", "n19", "n18"]


def test_a_node_met_first_is_not_taken_for_the_cheapest():
    """n1's least work at risk comes first (10 s), but its plan must move both its jobs
    (310 s); n2's one job (50 s) is the cheaper plan, found though met later."""
    c = Cluster(gpus=(8, 8))
    c.running("x", "n1", (0, 1), ckpt=NOW - 10)
    c.running("y", "n1", (2, 3), ckpt=NOW - 300)
    c.running("z", "n2", (0, 1, 2, 3), ckpt=NOW - 50)
    c.pending("big", gpus=8)
    cfg = PreemptionConfig(defrag_max_plans=1)
    assert c.plan("big", cfg) == ("z",)
    assert c.decisions(cfg)[0].victims == ("z",)
