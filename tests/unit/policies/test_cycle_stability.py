"""The cycle's rules that keep borrow and reclaim from going back and forth
(docs/design/scheduling-fairness.md, "Borrow and reclaim"): one rule for who borrows
(``claims_guarantee``), shared by the fair-share tiers, the guarantee hold and the
preemptor; tiers computed with the preemptions' beneficiaries counted; the nomination that
binds a beneficiary to what was freed for it; and the guarantee hold, with its bound.

Table-driven, on clusters built through the reducer; the property that the cycle and the
preemptor classify every team alike is in ``test_queue_properties``."""
from __future__ import annotations

import pytest

from gpusched.core import events as ev
from gpusched.policies.memory import CycleMemory
from gpusched.policies.preemption.decisions import victims_for
from gpusched.policies.preemption.victim_rules import PreemptionConfig
from gpusched.policies.queueing.fairshare import tier_of
from gpusched.policies.queueing.quota import OrgQuota, QueueTree, TeamQuota, claims_guarantee
from gpusched.policies.scheduler import Scheduler, SchedulerConfig, Unplaced
from tests.unit.policies.preemption_configs import other_rules
from tests.unit.policies.fairness_clusters import Cluster


def two_teams(guaranteed: float) -> QueueTree:
    return QueueTree(orgs={"org": OrgQuota(teams={"a": TeamQuota(guaranteed_gpus=guaranteed),
                                                  "b": TeamQuota(guaranteed_gpus=guaranteed)})})


# --- who borrows: one rule ---------------------------------------------------------------
@pytest.mark.parametrize("held, job, guaranteed, claims", [
    (0, 4_000, 8_000, True),        # within the guarantee
    (4_000, 4_000, 8_000, True),    # up to it exactly
    (6_000, 4_000, 8_000, True),    # below it, crossing it: claimed, not borrowed
    (7_999, 4_000, 8_000, True),
    (8_000, 1_000, 8_000, False),   # at it: any more is borrowed
    (9_000, 1_000, 8_000, False),
    (0, 1_000, 0, False),           # no guarantee: always borrowed
    (8_000, 0, 8_000, True),        # a job without GPUs takes nothing
])
def test_claims_guarantee(held, job, guaranteed, claims):
    assert claims_guarantee(held, job, guaranteed) is claims


def crossing_cluster(a_holds: int) -> Cluster:
    """3 nodes x 8 GPUs, teams a and b guaranteed 8 each (8 GPUs nobody's): a holds
    ``a_holds`` on n0, b an 8-GPU job on n1, 1-GPU jobs on the rest of n0 and 8 on n2 —
    every GPU taken. a waits for a 4-GPU job."""
    c = Cluster(nodes=3)
    c.hold("a", a_holds, node="n0")
    c.hold("b", 8, node="n1")
    for _ in range(8 - a_holds):
        c.hold("b", 1, node="n0")
    for _ in range(8):
        c.hold("b", 1, node="n2")
    c.submit("a-job", "a", gpus=4)
    return c


@pytest.mark.parametrize("a_holds, reclaimed", [
    (6, 4),       # 6 + 4 crosses a's guarantee of 8: claimed, so four of b's borrowed 1-GPU jobs go
    (4, 4),       # 4 + 4 fits the guarantee
    (8, None),    # a at its guarantee borrows: no reclaim
], ids=["crossing", "within", "at-guarantee"])
def test_cycle_and_preemptor_agree_on_a_job_crossing_its_guarantee(a_holds, reclaimed):
    c = crossing_cluster(a_holds)
    tree = two_teams(8)
    job = c.state.jobs["a-job"]
    victims = victims_for(c.state, job, c.log.now + 100, CycleMemory(), other_rules(quotas=tree))
    assert (None if victims is None else len(victims)) == reclaimed
    # The cycle ranks the job in the guarantee tier exactly when the preemptor reclaims for it.
    assert (tier_of(c.state, job, tree) == 0) is (reclaimed is not None)
    if victims:
        assert {c.state.jobs[v].team for v in victims} == {"b"}


# --- tiers with the beneficiaries counted ------------------------------------------------
def test_a_nominee_counts_in_its_teams_tier_before_the_others_are_ranked():
    # a and b hold 4 of their 8 each. a's nominee (4 GPUs, for whom c's job was preempted)
    # takes a to its guarantee, so a's other job (submitted first) borrows and b's, which
    # does not, goes before it. Ranked without the nominee, a's job went first.
    c = Cluster(nodes=3)
    c.hold("a", 4, node="n0")
    c.hold("b", 4, node="n1")
    victim = c.hold("c", 4, node="n2")
    c.submit("a-first", "a", gpus=2)
    c.submit("nominee", "a", gpus=4)
    c.submit("b-job", "b", gpus=2)
    assert c.log(ev.JobPreempted, job_id=victim, attempt=0, for_job="nominee", reason="priority: test").accepted
    c.log.stopped(victim)
    tree = QueueTree(orgs={"org": OrgQuota(teams={"a": TeamQuota(guaranteed_gpus=8),
                                                  "b": TeamQuota(guaranteed_gpus=8)}),
                           "other": OrgQuota(teams={"c": TeamQuota()})})
    decisions = Scheduler(SchedulerConfig(queue="fair-share", quotas=tree)).cycle(c.state, c.log.now, CycleMemory())
    assert [d.job_id for d in decisions if d.job_id != victim] == ["nominee", "b-job", "a-first"]


# --- the nomination binds ----------------------------------------------------------------
def test_a_nominee_is_placed_on_the_nodes_freed_for_it():
    # n0 has one free GPU (best fit's tightest gap); the preemption freed one on n1, nominated
    # for "nominee". Best fit alone would put the nominee on n0, and n1's freed GPU would go
    # to the next job; the nomination binds it to n1.
    c = Cluster(nodes=2)
    c.hold("c", 7, node="n0")
    c.hold("c", 3, node="n1")
    victim = c.hold("b", 1, node="n1")
    c.submit("nominee", "a", gpus=1)
    assert c.log(ev.JobPreempted, job_id=victim, attempt=0, for_job="nominee", reason="reclaim: test").accepted
    c.log.stopped(victim)
    decisions = {d.job_id: d for d in Scheduler(SchedulerConfig(queue="fifo")).cycle(c.state, c.log.now, CycleMemory())}
    assert {w.node for w in decisions["nominee"].workers} == {"n1"}


def test_a_nominee_that_its_nodes_do_not_take_goes_elsewhere():
    # The freed GPU is on n1, but the nominee needs 2 GPUs: n0's two free ones take it.
    c = Cluster(nodes=2)
    c.hold("c", 6, node="n0")
    c.hold("c", 6, node="n1")
    victim = c.hold("b", 1, node="n1")
    c.hold("c", 1, node="n1")
    c.submit("nominee", "a", gpus=2)
    assert c.log(ev.JobPreempted, job_id=victim, attempt=0, for_job="nominee", reason="reclaim: test").accepted
    c.log.stopped(victim)
    decisions = {d.job_id: d for d in Scheduler(SchedulerConfig(queue="fifo")).cycle(c.state, c.log.now, CycleMemory())}
    assert {w.node for w in decisions["nominee"].workers} == {"n0"}


def planned_pair(n1_taken_since: bool) -> dict:
    """n0, n1 and n2 have 4 GPUs each. On n0 two are free and a victim frees a third, on n1
    one is free: the preemptor planned "pair" (2 x 1 GPU) one worker on each. n2 has two
    free GPUs, the tightest gap that takes the whole gang: where the gang planner and best
    fit would put it. ``n1_taken_since``: a job took n1's free GPU after the plan. The
    cycle's decisions by job."""
    c = Cluster(nodes=3, gpus=4)
    victim = c.hold("c", 1, node="n0")
    c.hold("c", 1, node="n0")
    c.hold("c", 3, node="n1")
    c.hold("c", 2, node="n2")
    c.submit("pair", "a", gpus=1, workers=2)
    assert c.log(ev.JobPreempted, job_id=victim, attempt=0, for_job="pair", reason="priority: test",
                 planned_nodes=("n0", "n1")).accepted
    c.log.stopped(victim)
    if n1_taken_since:
        c.hold("c", 1, node="n1")
    return {d.job_id: d for d in Scheduler(SchedulerConfig(queue="fifo")).cycle(c.state, c.log.now, CycleMemory())}


def test_a_nominee_goes_worker_by_worker_where_it_was_planned():
    assert sorted(w.node for w in planned_pair(n1_taken_since=False)["pair"].workers) == ["n0", "n1"]


def test_a_nominee_whose_plan_no_longer_fits_goes_where_its_nominated_nodes_take_it():
    # Not as planned (n1 is full), still bound: both workers on n0, not on n2's tighter gap.
    assert sorted(w.node for w in planned_pair(n1_taken_since=True)["pair"].workers) == ["n0", "n0"]


@pytest.mark.parametrize("queue", ["fifo", "fair-share"])
def test_nominees_are_placed_in_the_order_they_were_nominated(queue):
    # One preemptor pass freed n0 for "big" (3 GPUs), then n0's last GPU and n1's for
    # "pair" (2 x 1 GPU), booking "big" first. "pair" is first in the queue; placed first,
    # it would pack onto n0 and leave "big" 2 GPUs: nominees go in the preemptor's order.
    c = Cluster(nodes=2, gpus=4)
    for_big = c.hold("c", 3, node="n0")
    for_pair = [c.hold("c", 1, node="n0"), c.hold("c", 1, node="n1")]
    c.hold("c", 3, node="n1")
    c.submit("pair", "a", gpus=1, workers=2)
    c.submit("big", "a", gpus=3)
    for victim, beneficiary in [(for_big, "big"), *((v, "pair") for v in for_pair)]:
        assert c.log(ev.JobPreempted, job_id=victim, attempt=0, for_job=beneficiary, reason="priority: test").accepted
        c.log.stopped(victim)
    cycle = Scheduler(SchedulerConfig(queue=queue)).cycle(c.state, c.log.now, CycleMemory())
    decisions = {d.job_id: d for d in cycle}
    assert {w.node for w in decisions["big"].workers} == {"n0"}
    assert sorted(w.node for w in decisions["pair"].workers) == ["n0", "n1"]


# --- the guarantee hold ------------------------------------------------------------------
def held_cluster(a_holds: int, b_holds: int, a_waits: int | None, b_asks: int) -> Cluster:
    """4 nodes x 8 GPUs, a on n0-n1, b on n2-n3. a waits for ``a_waits`` GPUs (None: a
    waits for nothing), b for ``b_asks``."""
    c = Cluster()
    for team, held, nodes in (("a", a_holds, ("n0", "n1")), ("b", b_holds, ("n2", "n3"))):
        for node, gpus in zip(nodes, (min(held, 8), held - min(held, 8))):
            if gpus:
                c.hold(team, gpus, node=node)
    if a_waits is not None:
        c.submit("a-job", "a", gpus=a_waits)
    c.submit("b-job", "b", gpus=b_asks)
    return c


@pytest.mark.parametrize("guaranteed, a_holds, b_holds, a_waits, b_asks, later_s, hold_s, placed", [
    # a (14 of 16) waits for 4 GPUs, 2 are free: b at its guarantee would borrow them — held.
    (16, 14, 16, 4, 1, 0, 1200, False),
    # a waits for nothing: its unused guarantee is lent.
    (16, 14, 16, None, 1, 0, 1200, True),
    # a's usage has not changed for longer than the hold: lent (the bound).
    (16, 14, 16, 4, 1, 1300, 1200, True),
    # the hold switched off
    (16, 14, 16, 4, 1, 0, 0, True),
    # b is below its guarantee (15 of 16), its 2-GPU job crosses it: claimed, not held.
    (16, 14, 15, 4, 2, 0, 1200, True),
    # guarantees of 12: a (10) keeps 2 back; 6 are free (n1): b may borrow 1 (5 left) ...
    (12, 10, 16, 8, 1, 0, 1200, True),
    # ... but not 5 (1 left)
    (12, 10, 16, 8, 5, 0, 1200, False),
], ids=["kept-for-waiting-team", "lent-when-nobody-waits", "lent-after-the-bound", "no-hold",
        "own-guarantee-crossing", "borrow-leaves-what-is-kept", "borrow-takes-what-is-kept"])
def test_free_capacity_below_a_waiting_teams_guarantee_is_not_lent(
        guaranteed, a_holds, b_holds, a_waits, b_asks, later_s, hold_s, placed):
    c = held_cluster(a_holds, b_holds, a_waits, b_asks)
    config = SchedulerConfig(queue="fair-share", quotas=two_teams(guaranteed), guarantee_hold_s=hold_s)
    result = Scheduler(config).schedule(c.state, c.log.now + later_s, CycleMemory())
    assert "a-job" not in {d.job_id for d in result.decisions}     # it never fits here
    assert ("b-job" in {d.job_id for d in result.decisions}) is placed
    if not placed:
        assert result.reason("b-job") is Unplaced.HELD_FOR_GUARANTEE


def test_a_nominee_that_borrows_is_not_held():
    # As "kept-for-waiting-team", but b's 1-GPU job is the beneficiary of a preemption (of
    # c's job on n1): the capacity freed for it is its own, whatever a waits for.
    c = held_cluster(14, 16, 4, 1)
    victim = c.hold("c", 1, node="n1")
    assert c.log(ev.JobPreempted, job_id=victim, attempt=0, for_job="b-job", reason="priority: test").accepted
    c.log.stopped(victim)
    config = SchedulerConfig(queue="fair-share", quotas=two_teams(16))
    result = Scheduler(config).schedule(c.state, c.log.now, CycleMemory())
    assert "b-job" in {d.job_id for d in result.decisions}


def test_a_job_its_limits_keep_out_holds_nothing():
    # As "kept-for-waiting-team", but a's waiting job is over a's limit (18 > 17): it will
    # never be placed, so it keeps nothing back and b borrows the free GPUs.
    c = held_cluster(14, 16, 4, 1)
    tree = QueueTree(orgs={"org": OrgQuota(teams={"a": TeamQuota(guaranteed_gpus=16, limit_gpus=17),
                                                  "b": TeamQuota(guaranteed_gpus=16)})})
    result = Scheduler(SchedulerConfig(queue="fair-share", quotas=tree)).schedule(c.state, c.log.now, CycleMemory())
    assert result.reason("a-job") is Unplaced.QUOTA
    assert "b-job" in {d.job_id for d in result.decisions}


def test_a_job_the_hold_refused_is_not_parked():
    # Parking keeps jobs that did not fit out of later cycles at the same capacity; a job
    # the hold refused may be placed at the same capacity once the hold lapses.
    c = held_cluster(14, 16, 4, 1)
    waited_from = c.state.jobs["a-job"].pending_since
    scheduler = Scheduler(SchedulerConfig(queue="fair-share", quotas=two_teams(16), guarantee_hold_s=5))
    memory = CycleMemory()
    first = scheduler.schedule(c.state, waited_from + 1, memory)
    assert first.reason("b-job") is Unplaced.HELD_FOR_GUARANTEE and "b-job" not in memory.parked.jobs
    later = scheduler.schedule(c.state, waited_from + 6, memory)     # same epoch, the hold lapsed
    assert "b-job" in {d.job_id for d in later.decisions}
