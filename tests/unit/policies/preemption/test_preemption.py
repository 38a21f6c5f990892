"""Victim selection (gpusched.policies.preemption.decisions) on small hand-built clusters.

Clusters are built through the reducer (NodeRegistered, JobSubmitted, JobPlaced,
WorkerStarted, CheckpointSaved). Every policy call is wrapped so the test also checks
that it left the state digest unchanged.
"""
from __future__ import annotations

import pytest

from gpusched.core import events as ev
from gpusched.core.digest import digest
from gpusched.core.model import GpuSlot, JobPhase
from gpusched.core.priority import priority_value
from gpusched.policies.memory import CycleMemory
from gpusched.policies.statement import tentative
from gpusched.policies.placement.gang import place_gang
from gpusched.policies.placement.registry import make_placement
from gpusched.policies.preemption.decisions import Preemption, preemption_decisions, preemption_events, victims_for
from tests.unit.policies.preemption_configs import other_rules
from tests.unit.core.builders import Log, make_node, make_spec, whole
from tests.unit.policies.preemption_clusters import NOW, BE, TR, HI, PROD, Cluster, quotas


# --- the ordering of victims ------------------------------------------------------------------
def test_lowest_priority_first_even_with_more_work_at_risk():
    c = Cluster()
    c.running("be", ("n1", (0, 1, 2, 3)), priority_class=BE)                  # 1000 s at risk
    c.running("tr", ("n2", (0, 1, 2, 3)), priority_class=TR, ckpt=NOW - 1)    # 1 s at risk
    c.pending("hi", gpus=4, priority_class=HI)
    assert c.victims("hi") == ("be",)


def test_borrowed_first_among_equal_priority():
    c = Cluster()
    # team a holds 4 GPUs within its guarantee of 4; team b holds 4 with none guaranteed.
    c.running("a1", ("n1", (0, 1, 2, 3)), team="a", ckpt=NOW - 1)
    c.running("b1", ("n2", (0, 1, 2, 3)), team="b")
    c.pending("hi", gpus=4, team="c", priority_class=HI)
    assert c.victims("hi", quotas(a=4, b=0)) == ("b1",)
    # Without quotas both are borrowed: least work at risk decides.
    assert c.victims("hi", quotas(a=0, b=0)) == ("a1",)


def test_borrowed_is_the_part_above_the_guarantee():
    c = Cluster(nodes=3)
    # team a: guarantee 4 GPUs; a-old (oldest) is inside it, a-new is borrowed.
    c.running("a-old", ("n1", (0, 1, 2, 3)), team="a", started=NOW - 5000, ckpt=NOW - 1)
    c.running("a-new", ("n2", (0, 1, 2, 3)), team="a", started=NOW - 1000)
    c.running("b1", ("n3", (0, 1, 2, 3)), team="b", started=NOW - 1000, ckpt=NOW - 2)
    c.pending("hi", gpus=4, team="c", priority_class=HI)
    # b1 (guarantee 4, holds 4) is not borrowed; a-new is, despite more work at risk.
    assert c.victims("hi", quotas(a=4, b=4)) == ("a-new",)


def test_least_work_at_risk_then_fewest_jobs():
    c = Cluster(nodes=3)
    c.running("w900", ("n1", (0, 1, 2, 3)), ckpt=NOW - 900)
    c.running("w100", ("n2", (0, 1, 2, 3)), ckpt=NOW - 100)
    c.running("w500", ("n3", (0, 1, 2, 3)), ckpt=NOW - 500)
    c.pending("hi", gpus=4, priority_class=HI)
    assert c.victims("hi") == ("w100",)

    c = Cluster()
    c.running("p1", ("n1", (0, 1)), ckpt=NOW)
    c.running("p2", ("n1", (2, 3)), ckpt=NOW)
    c.running("big", ("n2", (0, 1, 2, 3)), ckpt=NOW)
    c.pending("hi", gpus=4, priority_class=HI)
    assert c.victims("hi") == ("big",)


def test_many_cheap_victims_beat_one_of_a_higher_class():
    c = Cluster()
    for i in range(4):
        c.running(f"be{i}", ("n1", (i,)), priority_class=BE)
    c.running("tr", ("n2", (0, 1, 2, 3)), priority_class=TR, ckpt=NOW)
    c.pending("prod", gpus=4, priority_class=PROD)
    assert sorted(c.victims("prod")) == ["be0", "be1", "be2", "be3"]


def test_only_the_victims_needed_on_the_node():
    c = Cluster(nodes=1, gpus=8)
    c.running("small", ("n1", (0,)), priority_class=BE, ckpt=NOW)
    c.running("mid", ("n1", (1, 2, 3, 4)), priority_class=BE, ckpt=NOW - 50)
    c.running("big", ("n1", (5, 6, 7)), priority_class=BE, ckpt=NOW - 100)
    c.pending("hi", gpus=4, priority_class=HI)
    # Cheapest first: small (1 GPU free), then mid (5 free); with mid gone, small is not
    # needed: it is put back.
    assert c.victims("hi") == ("mid",)
    c.pending("hi5", gpus=5, priority_class=HI)
    assert c.victims("hi5") == ("small", "mid")


# --- eligibility ------------------------------------------------------------------------------
@pytest.mark.parametrize("blocker, expected", [
    ({"preemptible": False}, None),
    ({"started": NOW - 599}, None),           # younger than min_runtime_s = 600
    ({"started": NOW - 600}, ("x",)),         # exactly min_runtime_s
    ({"priority_class": TR}, None),           # equal priority, no reclaim
    ({"priority_class": HI}, None),           # higher priority
    ({"priority_class": PROD}, None),
    ({"priority_class": BE}, ("x",)),
    ({"start": False, "started": NOW - 700}, ("x",)),  # PLACED, not started: placed 700 s ago
    ({"start": False, "started": NOW - 5}, None),
])
def test_eligibility(blocker, expected):
    c = Cluster(nodes=1)
    kw = {"priority_class": BE, **blocker}
    c.running("x", ("n1", (0, 1, 2, 3)), **kw)
    c.pending("tr", gpus=2, priority_class=TR)
    assert c.victims("tr") == expected


def test_min_runtime_is_configurable():
    c = Cluster(nodes=1)
    c.running("x", ("n1", (0, 1, 2, 3)), priority_class=BE, started=NOW - 100)
    c.pending("tr", gpus=2)
    assert c.victims("tr", other_rules(min_runtime_s=300)) is None
    assert c.victims("tr", other_rules(min_runtime_s=60)) == ("x",)


def test_non_preemptible_skipped_for_a_preemptible_one_of_higher_class():
    c = Cluster()
    c.running("keep", ("n1", (0, 1, 2, 3)), priority_class=BE, preemptible=False)
    c.running("tr", ("n2", (0, 1, 2, 3)), priority_class=TR)
    c.pending("prod", gpus=4, priority_class=PROD)
    assert c.victims("prod") == ("tr",)


def test_already_placeable_needs_no_victims():
    c = Cluster()
    c.running("be", ("n1", (0, 1, 2, 3)), priority_class=BE)
    c.pending("hi", gpus=2, priority_class=HI)
    assert c.victims("hi") == ()
    assert c.decisions() == []


# --- quota reclaim ----------------------------------------------------------------------------
def test_reclaim_equal_priority_from_a_borrower():
    c = Cluster(nodes=1)
    c.running("b1", ("n1", (0, 1, 2, 3)), team="b")             # b has no guarantee: borrowed
    c.pending("a1", gpus=4, team="a")                            # a is guaranteed 8 and uses 0
    cfg = quotas(a=8, b=0)
    assert c.victims("a1") is None                               # no quotas: equal priority is safe
    assert c.victims("a1", cfg) == ("b1",)
    (d,) = c.decisions(cfg)
    assert d == Preemption("a1", ("b1",), "reclaim", ("n1",), ("n1",))


def test_no_reclaim_when_over_guarantee_or_from_a_guaranteed_job_or_higher_class():
    c = Cluster(nodes=2)
    c.running("a0", ("n2", (0, 1, 2, 3)), team="a")
    c.running("b1", ("n1", (0, 1, 2, 3)), team="b")
    c.pending("a1", gpus=4, team="a")
    assert c.victims("a1", quotas(a=4, b=0)) is None             # a would exceed its guarantee
    assert c.victims("a1", quotas(a=8, b=4)) is None             # b is within its guarantee
    assert c.victims("a1", quotas(a=8, b=0)) == ("b1",)

    c = Cluster(nodes=1)
    c.running("b1", ("n1", (0, 1, 2, 3)), team="b", priority_class=HI)
    c.pending("a1", gpus=4, team="a")
    assert c.victims("a1", quotas(a=8, b=0)) is None             # never a higher class


def test_reclaim_reason_only_when_it_needs_reclaim():
    c = Cluster(nodes=1)
    c.running("b1", ("n1", (0, 1, 2, 3)), team="b", priority_class=BE)
    c.pending("a1", gpus=4, team="a")
    (d,) = c.decisions(quotas(a=8, b=0))
    assert d.reason == "priority" and d.victims == ("b1",)


# --- never for nothing --------------------------------------------------------------------------
def test_none_when_preempting_everything_eligible_would_not_fit():
    c = Cluster(nodes=2)
    c.running("keep", ("n1", (0, 1)), priority_class=BE, preemptible=False)
    c.running("be1", ("n1", (2, 3)), priority_class=BE)
    c.running("be2", ("n2", (0, 1)), priority_class=BE)
    c.running("hi2", ("n2", (2, 3)), priority_class=HI)
    c.pending("hi", gpus=4, priority_class=HI)
    assert c.victims("hi") is None     # 4 GPUs could be freed, but on two nodes
    assert c.decisions() == []


def test_none_when_no_node_is_big_enough():
    c = Cluster(nodes=2)
    c.running("be", ("n1", (0, 1, 2, 3)), priority_class=BE)
    c.pending("huge", gpus=8, priority_class=PROD)
    assert c.victims("huge") is None


def test_max_victims_bounds_the_set():
    c = Cluster(nodes=1, gpus=8)
    for i in range(8):
        c.running(f"be{i}", ("n1", (i,)), priority_class=BE)
    c.pending("hi", gpus=8, priority_class=HI)
    assert c.victims("hi", other_rules(max_victims=7)) is None
    assert len(c.victims("hi", other_rules(max_victims=8))) == 8


# --- gangs ------------------------------------------------------------------------------------
def test_gang_victim_is_preempted_whole():
    c = Cluster(nodes=2)
    c.running("gang", ("n1", (0, 1, 2, 3)), ("n2", (0, 1, 2, 3)), priority_class=BE)
    c.pending("hi", gpus=4, priority_class=HI)
    (d,) = c.decisions()
    assert d.victims == ("gang",) and d.nodes == ("n1", "n2")
    c.preempt(d)
    assert c.placeable("hi")
    assert c.state.nodes["n1"].free_whole_gpus() == c.state.nodes["n2"].free_whole_gpus() == 4


def test_gang_beneficiary_takes_victims_on_several_nodes():
    c = Cluster(nodes=3)
    c.running("be1", ("n1", (0, 1, 2, 3)), priority_class=BE)
    c.running("tr", ("n2", (0, 1, 2, 3)), priority_class=TR)
    c.running("be3", ("n3", (0, 1, 2, 3)), priority_class=BE)
    c.pending("gang", gpus=4, workers=2, priority_class=HI)
    assert sorted(c.victims("gang")) == ["be1", "be3"]
    (d,) = c.decisions()
    c.preempt(d)
    assert c.placeable("gang")


def test_gang_beneficiary_drops_victims_a_later_step_made_useless():
    c = Cluster(nodes=2)
    # Freeing n1 takes be-a then be-b (2 GPUs each); the gang victim frees both nodes at once.
    c.running("be-a", ("n1", (0, 1)), priority_class=BE, ckpt=NOW)
    c.running("be-b", ("n1", (2, 3)), priority_class=BE, ckpt=NOW)
    c.running("be-gang", ("n2", (0, 1, 2, 3)), priority_class=BE, ckpt=NOW)
    c.pending("gang", gpus=4, workers=2, priority_class=HI)
    victims = c.victims("gang")
    assert sorted(victims) == ["be-a", "be-b", "be-gang"]   # every one is needed: 8 GPUs


# --- one call, several decisions -----------------------------------------------------------------
def test_two_pending_jobs_get_disjoint_victims():
    c = Cluster(nodes=3)
    c.running("be1", ("n1", (0, 1, 2, 3)), priority_class=BE, ckpt=NOW)      # cheapest for both
    c.running("be2", ("n2", (0, 1, 2, 3)), priority_class=BE, ckpt=NOW - 10)
    c.running("tr3", ("n3", (0, 1, 2, 3)), priority_class=TR)
    c.pending("hi1", gpus=4, priority_class=HI, at=NOW - 20)
    c.pending("hi2", gpus=4, priority_class=HI, at=NOW - 10)
    decisions = c.decisions()
    assert [(d.for_job, d.victims) for d in decisions] == [("hi1", ("be1",)), ("hi2", ("be2",))]


def test_freed_capacity_is_not_counted_twice():
    c = Cluster(nodes=1)
    c.running("be1", ("n1", (0, 1, 2, 3)), priority_class=BE)
    c.pending("hi1", gpus=4, priority_class=HI, at=NOW - 20)
    c.pending("hi2", gpus=4, priority_class=HI, at=NOW - 10)
    assert [(d.for_job, d.victims) for d in c.decisions()] == [("hi1", ("be1",))]


def test_jobs_that_fit_are_booked_before_lower_ones_preempt():
    c = Cluster(nodes=2)
    c.running("be1", ("n1", (0, 1, 2, 3)), priority_class=BE)
    c.pending("prod", gpus=4, priority_class=PROD)     # fits n2 as is: the scheduler takes it
    c.pending("hi", gpus=4, priority_class=HI)
    assert [(d.for_job, d.victims) for d in c.decisions()] == [("hi", ("be1",))]
    c.pending("hi-b", gpus=4, priority_class=HI)
    assert [(d.for_job, d.victims) for d in c.decisions()] == [("hi", ("be1",))]


def test_in_flight_preemptions_are_not_repeated():
    c = Cluster(nodes=2)
    c.running("be1", ("n1", (0, 1, 2, 3)), priority_class=BE)
    c.running("be2", ("n2", (0, 1, 2, 3)), priority_class=BE, ckpt=NOW - 10)
    c.pending("hi1", gpus=4, priority_class=HI, at=NOW - 20)
    (d,) = c.decisions(limit=1)
    assert d.victims == ("be2",)
    for e in preemption_events(c.state, d, NOW):
        assert c.log.replay(e).accepted
    assert c.state.nominations["hi1"][0] == ("n2",)
    # hi1 waits for be2 to checkpoint: no second set for it, and be2 is nobody else's.
    assert c.decisions(now=NOW + 1) == []
    c.pending("hi2", gpus=4, priority_class=HI, at=NOW)
    assert [(x.for_job, x.victims) for x in c.decisions(now=NOW + 1)] == [("hi2", ("be1",))]
    assert c.victims("hi2", now=NOW + 1) == ("be1",)


def test_limit_and_events():
    c = Cluster(nodes=3)
    for i in range(3):
        c.running(f"be{i}", (f"n{i + 1}", (0, 1, 2, 3)), priority_class=BE)
        c.pending(f"hi{i}", gpus=4, priority_class=HI, at=NOW - 30 + i)
    assert len(c.decisions(limit=2)) == 2
    decisions = c.decisions()
    assert len(decisions) == 3
    events = preemption_events(c.state, decisions[0], NOW)
    assert [(e.job_id, e.attempt, e.for_job) for e in events] == [(decisions[0].victims[0], 0, "hi0")]
    assert len({e.event_id for d in decisions for e in preemption_events(c.state, d, NOW)}) == 3


def test_victims_of_every_decision_are_freed_for_their_job():
    c = Cluster(nodes=4)
    c.running("be-gang", ("n1", (0, 1)), ("n2", (0, 1)), priority_class=BE)
    c.running("be2", ("n1", (2, 3)), priority_class=BE, ckpt=NOW)
    c.running("tr", ("n3", (0, 1, 2, 3)), priority_class=TR)
    c.running("be4", ("n4", (0, 1, 2)), priority_class=BE, ckpt=NOW - 100)
    c.pending("prod", gpus=4, priority_class=PROD, at=NOW - 30)
    c.pending("hi", gpus=4, priority_class=HI, at=NOW - 20)
    decisions = c.decisions()
    assert [d.for_job for d in decisions] == ["prod", "hi"]
    seen: set[str] = set()
    for d in decisions:
        assert not seen & set(d.victims)
        seen |= set(d.victims)
        for v in d.victims:
            assert priority_value(c.job(v).spec.priority_class) < priority_value(c.job(d.for_job).spec.priority_class)
    for d in decisions:
        c.preempt(d)
    # Both beneficiaries fit together now.
    with tentative(c.state) as statement:
        for jid in ("prod", "hi"):
            assert place_gang(c.state, c.job(jid), make_placement("best-fit"), statement) is not None


# --- shares -------------------------------------------------------------------------------------
def test_gpu_share_victims():
    c = Cluster(nodes=1, gpus=1)
    log = c.log
    for jid, milli in (("s1", 600), ("s2", 300)):
        assert log(ev.JobSubmitted, job_id=jid, time=NOW - 1000,
                   spec=make_spec(name=jid, milli=milli, cpu=0, mem=0, priority_class=BE)).accepted
        assert log(ev.JobPlaced, job_id=jid, attempt=0, time=NOW - 1000,
                   workers=(ev.WorkerAssignment(0, "n1", (GpuSlot(0, milli),)),)).accepted
        assert log(ev.WorkerStarted, job_id=jid, attempt=0, worker=0, node="n1", time=NOW - 1000).accepted
    c.pending("half", milli=500, priority_class=TR)
    assert c.victims("half") == ("s1",)
    c.pending("tiny", milli=100, priority_class=TR)
    assert c.victims("tiny") == ()


# --- scale ------------------------------------------------------------------------------------
def test_large_cluster_answers():
    """1,000 nodes of 8 GPUs, 5,000 running jobs: the right victims, node-local, state untouched.
    How long it takes is bench/preemption_bench.py's business, not a test's."""
    nodes = [make_node(f"n{i:04d}", gpus=8, cpu=1_000_000, mem=10_000_000) for i in range(1000)]
    log = Log(*nodes)
    classes = (BE, TR, TR, HI)
    k = 0
    for i, node in enumerate(nodes):
        # 5 jobs per node over 7 or 8 GPUs: 1+1+2+2+1 or 1+1+2+2+2.
        sizes = (1, 1, 2, 2, 1 + (i % 2))
        gpu = 0
        for size in sizes:
            jid = f"j{k}"
            k += 1
            spec = make_spec(name=jid, gpus=size, cpu=0, mem=0, team=f"t{k % 7}",
                             priority_class=classes[k % 4])
            log(ev.JobSubmitted, job_id=jid, spec=spec, time=NOW - 2000)
            log(ev.JobPlaced, job_id=jid, attempt=0, time=NOW - 2000,
                workers=(ev.WorkerAssignment(0, node.name, whole(*range(gpu, gpu + size))),))
            log(ev.WorkerStarted, job_id=jid, attempt=0, worker=0, node=node.name, time=NOW - 1000 + k % 500)
            gpu += size
    state = log.state
    assert sum(1 for j in state.jobs.values() if j.phase is JobPhase.RUNNING) == 5000
    log(ev.JobSubmitted, job_id="big", spec=make_spec(name="big", gpus=8, cpu=0, mem=0, priority_class=PROD),
        time=NOW)
    log(ev.JobSubmitted, job_id="gang", time=NOW,
        spec=make_spec(name="gang", gpus=8, workers=2, cpu=0, mem=0, priority_class=PROD))
    before = digest(state)
    victims = victims_for(state, state.jobs["big"], NOW, CycleMemory(), other_rules())
    assert victims and all(priority_value(state.jobs[v].spec.priority_class) < 1000 for v in victims)
    assert len({w.node for v in victims for w in state.jobs[v].workers}) == 1     # node-local
    decisions = preemption_decisions(state, NOW, CycleMemory(), other_rules())
    assert digest(state) == before
    assert [d.for_job for d in decisions] == ["big", "gang"]
