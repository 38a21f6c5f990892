"""Fair share: DRF ordering, decayed usage, aging, quota tiers and limits.

Clusters are built through the reducer; "holding" means a job placed and running.
"""
from __future__ import annotations

import json
import pickle

import pytest

from gpusched.policies.memory import CycleMemory
from gpusched.policies.queueing.fairshare import QueueContext, dominant_share, fair_share
from gpusched.policies.queueing.quota import OrgQuota, QueueTree, TeamAccount, TeamQuota, team_accounts, within_limits
from gpusched.policies.scheduler import Scheduler, SchedulerConfig
from gpusched.policies.queueing.usage import Demand, UsageLedger
from tests.unit.policies.fairness_clusters import Cluster


def order_ids(cluster: Cluster, now: float = 100.0, **context) -> list[str]:
    return [j.job_id for j in fair_share(cluster.state, cluster.pending(), now, QueueContext(**context))]


# --- DRF ------------------------------------------------------------------------------
@pytest.mark.parametrize("a_holds, b_holds, weights, first", [
    # running jobs (gpus, cpu milli) of team a and of team b
    ([(8, 8_000)], [(4, 8_000)], (1, 1), "b"),                 # GPU dominant: a 25 %, b 12.5 %
    ([(8, 16_000)], [(1, 64_000), (1, 64_000)], (1, 1), "a"),  # b's CPU share (50 %) beats a's GPU 25 %
    ([(8, 0)], [(6, 0)], (2, 1), "a"),                         # weight 2 halves a's 25 % below b's 18.75 %
    ([(8, 0)], [(6, 0)], (1, 1), "b"),                         # same, equal weights
    ([], [], (1, 1), "a"),                                     # a tie goes to submission order
], ids=["gpu-dominant", "cpu-dominant", "weighted", "unweighted", "tie"])
def test_drf_orders_teams_by_weighted_dominant_share(a_holds, b_holds, weights, first):
    c = Cluster()
    for team, holds in (("a", a_holds), ("b", b_holds)):
        for gpus, cpu in holds:
            c.hold(team, gpus, cpu)
    c.submit("a-job", "a")
    c.submit("b-job", "b")
    tree = QueueTree(orgs={
        "o1": OrgQuota(teams={"a": TeamQuota(weight=weights[0])}, weight=weights[0]),
        "o2": OrgQuota(teams={"b": TeamQuota(weight=weights[1])}),
    })
    assert order_ids(c, tree=tree)[0] == f"{first}-job"


def test_drf_interleaves_teams_within_one_order():
    c = Cluster()
    for i in range(3):
        c.submit(f"a{i}", "a", gpus=2)
    for i in range(3):
        c.submit(f"b{i}", "b", gpus=2)
    assert order_ids(c) == ["a0", "b0", "a1", "b1", "a2", "b2"]


def test_org_share_ranks_before_team_share():
    # Org x holds 8 GPUs (through x1); org y holds 6. x2 holds nothing, yet y1 goes
    # first: x2's org already has more than y's.
    c = Cluster()
    tree = QueueTree(orgs={"x": OrgQuota(teams={"x1": TeamQuota(), "x2": TeamQuota()}),
                           "y": OrgQuota(teams={"y1": TeamQuota()})})
    c.hold("x1", 8)
    c.hold("y1", 6)
    c.submit("x2-job", "x2")
    c.submit("y1-job", "y1")
    assert order_ids(c, tree=tree) == ["y1-job", "x2-job"]


@pytest.mark.parametrize("usage, capacity, weight, expected", [
    ((8, 0, 0), (32, 256, 2048), 1.0, 0.25),
    ((8, 128, 0), (32, 256, 2048), 1.0, 0.5),
    ((8, 128, 0), (32, 256, 2048), 2.0, 0.25),
    ((8, 0, 0), (0, 256, 2048), 1.0, 0.0),        # a resource the cluster lacks is ignored
])
def test_dominant_share(usage, capacity, weight, expected):
    assert dominant_share(usage, capacity, weight) == pytest.approx(expected)


# --- decay ----------------------------------------------------------------------------
@pytest.mark.parametrize("half_life, elapsed, expected_gpus", [
    (100.0, 0.0, 8.0),
    (100.0, 100.0, 4.0),
    (100.0, 200.0, 2.0),
    (100.0, 300.0, 1.0),
    (50.0, 100.0, 2.0),
    (0.0, 100.0, 0.0),          # no half-life: only what is held now counts
])
def test_decayed_usage_halves_every_half_life(half_life, elapsed, expected_gpus):
    c = Cluster()
    job = c.hold("a", 8)
    ledger = UsageLedger(half_life)
    ledger.advance(c.state, 0.0)
    ledger.advance(c.state, 10_000.0)              # held for 100 half-lives: average = 8 GPUs
    for w in c.state.jobs[job].workers:
        c.log.finish(job, w.worker, 0)
    ledger.advance(c.state, 10_000.0)              # released at 10 000
    ledger.advance(c.state, 10_000.0 + elapsed)
    decayed = ledger.decayed().get("a", Demand())
    assert decayed.gpu_milli / 1000 == pytest.approx(expected_gpus, abs=1e-6)


def test_decay_builds_up_while_held():
    c = Cluster()
    c.hold("a", 8)
    ledger = UsageLedger(100.0)
    ledger.advance(c.state, 0.0)        # a fresh ledger starts from what is held
    assert ledger.decayed()["a"].gpu_milli == 8000
    c2 = Cluster()
    ledger2 = UsageLedger(100.0)
    ledger2.advance(c2.state, 0.0)      # nothing held yet
    c2.hold("a", 8)
    ledger2.advance(c2.state, 0.0)
    ledger2.advance(c2.state, 100.0)    # held 8 GPUs for one half-life from nothing
    assert ledger2.decayed()["a"].gpu_milli == pytest.approx(4000)


@pytest.mark.parametrize("elapsed_half_lives, first", [(0.5, "b-job"), (4.0, "a-job")])
def test_recent_usage_is_forgotten_over_time(elapsed_half_lives, first):
    # Team a held 16 GPUs and released them; team b holds 4 now. Right after, a's
    # decayed usage (about 16) ranks it behind b; a few half-lives later it has decayed
    # below b's 4 and a goes first.
    c = Cluster()
    big = c.hold("a", 8, node="n0"), c.hold("a", 8, node="n1")
    c.hold("b", 4, node="n2")
    ledger = UsageLedger(1000.0)
    ledger.advance(c.state, 0.0)
    ledger.advance(c.state, 50_000.0)
    for job in big:
        c.log.finish(job, 0, 0)
    ledger.advance(c.state, 50_000.0)
    now = 50_000.0 + elapsed_half_lives * 1000.0
    ledger.advance(c.state, now)
    c.submit("a-job", "a")
    c.submit("b-job", "b")
    assert order_ids(c, now, decayed=ledger.decayed(), aging_s=1e9)[0] == first


# --- aging ----------------------------------------------------------------------------
@pytest.mark.parametrize("now, first", [
    (500.0, "light-job"),       # nothing aged: the team with the smaller share first
    (1_500.0, "heavy-job"),     # heavy-job waited past aging_s, light-job did not
    (5_000.0, "heavy-job"),     # both aged: oldest first, whatever the shares
])
def test_aging_puts_long_waiting_jobs_first(now, first):
    c = Cluster()
    c.hold("heavy", 8)
    c.hold("heavy", 8)
    c.submit("heavy-job", "heavy", at=100.0)
    c.submit("light-job", "light", at=900.0)
    assert order_ids(c, now, aging_s=1000.0)[0] == first


def test_aged_job_goes_first_within_its_team():
    c = Cluster()
    c.submit("old-low", "a", at=0.0, priority_class="best-effort")
    c.submit("new-high", "a", at=900.0, priority_class="training-high")
    assert order_ids(c, 500.0, aging_s=1000.0) == ["new-high", "old-low"]
    assert order_ids(c, 1000.0, aging_s=1000.0) == ["old-low", "new-high"]


# --- guarantees -----------------------------------------------------------------------
GUARANTEES = QueueTree(orgs={
    "research": OrgQuota(guaranteed_gpus=24, teams={
        "llm": TeamQuota(guaranteed_gpus=12, limit_gpus=24),
        "vision": TeamQuota(guaranteed_gpus=4, limit_gpus=24),
    }),
    "product": OrgQuota(teams={"search": TeamQuota(guaranteed_gpus=8, limit_gpus=16)}),
    "lab": OrgQuota(teams={"interns": TeamQuota(guaranteed_gpus=0, limit_gpus=32)}),
})


@pytest.mark.parametrize("holding, pending, expected", [
    # search is under its guarantee: ahead of interns, who borrow, though interns hold less.
    ({"search": 4, "interns": 1}, [("interns-j", "interns", 2), ("search-j", "search", 2)],
     ["search-j", "interns-j"]),
    # search would cross its guarantee (6 + 4 > 8) but is below it: the job is claimed
    # against the guarantee (claims_guarantee), not ranked as a borrower's, so search still
    # goes first. Ranked as a borrower, interns' smaller share would take the free GPUs and
    # a reclaim would take them back.
    ({"search": 6, "interns": 1}, [("interns-j", "interns", 2), ("search-j", "search", 4)],
     ["search-j", "interns-j"]),
    # search at its guarantee: any job of it borrows, and interns' smaller share goes first.
    ({"search": 8, "interns": 1}, [("interns-j", "interns", 2), ("search-j", "search", 4)],
     ["interns-j", "search-j"]),
    # llm fits its own guarantee (10 + 2 <= 12); vision is over its own, borrowing from
    # its org (18 <= 24): llm first, though vision holds less.
    ({"llm": 10, "vision": 6}, [("vision-j", "vision", 2), ("llm-j", "llm", 2)],
     ["llm-j", "vision-j"]),
    # vision is over its own guarantee but research is under its 24: it borrows from its
    # idle sibling llm, ahead of interns borrowing from other orgs.
    ({"vision": 8, "interns": 1}, [("interns-j", "interns", 2), ("vision-j", "vision", 2)],
     ["vision-j", "interns-j"]),
    # over a limit: last, whatever its share.
    ({"search": 8}, [("search-j", "search", 16), ("interns-j", "interns", 8)],
     ["interns-j", "search-j"]),
], ids=["guaranteed-first", "crossing-guarantee-claims", "at-guarantee-borrows",
        "own-guarantee-before-org-borrowing",
        "org-sibling-before-others", "over-limit-last"])
def test_under_quota_teams_come_before_borrowers(holding, pending, expected):
    c = Cluster()
    for team, gpus in holding.items():
        for chunk in (8,) * (gpus // 8) + ((gpus % 8,) if gpus % 8 else ()):
            c.hold(team, chunk)
    for job_id, team, gpus in pending:
        c.submit(job_id, team, gpus)
    assert order_ids(c, tree=GUARANTEES) == expected


def test_under_quota_team_gets_the_last_free_gpus():
    # 4 GPUs free; interns (borrower, tiny share) and search (under its guarantee)
    # both want 4. The cycle gives them to search.
    c = Cluster()
    c.hold("llm", 8, node="n0")
    c.hold("llm", 8, node="n1")
    c.hold("llm", 8, node="n2")
    c.hold("interns", 4, node="n3")
    c.submit("interns-j", "interns", 4)
    c.submit("search-j", "search", 4)
    decisions = Scheduler(SchedulerConfig(queue="fair-share", quotas=GUARANTEES)).cycle(c.state, 100.0, CycleMemory())
    assert [d.job_id for d in decisions] == ["search-j"]


def test_team_accounts_report_guaranteed_used_and_borrowed():
    c = Cluster()
    c.hold("llm", 8)
    c.hold("llm", 6)
    c.hold("interns", 2)
    accounts = team_accounts(c.state, GUARANTEES)
    assert accounts["llm"] == TeamAccount("llm", "research", 12_000, 24_000, 14_000)
    assert accounts["llm"].borrowed_milli == 2_000
    assert accounts["vision"].used_milli == 0 and accounts["vision"].unused_guarantee_milli == 4_000
    assert accounts["interns"].borrowed_milli == 2_000
    assert accounts["search"].borrowed_milli == 0


# --- limits ---------------------------------------------------------------------------
@pytest.mark.parametrize("queue", ["fifo", "priority", "fair-share"])
@pytest.mark.parametrize("team_limit, org_limit, held, jobs, placed", [
    (4, None, 0, [2, 2, 2], 2),       # the third would make 6 > 4
    (4, None, 2, [2, 2], 1),          # already holds 2
    (8, None, 0, [4, 6, 2], 2),       # the 6 is skipped, the 2 behind it still fits
    (None, 6, 0, [2, 2, 2, 2], 3),    # the org limit binds
    (None, None, 0, [8, 8, 8], 3),    # no limits: the cluster does
])
def test_placement_never_exceeds_limits(queue, team_limit, org_limit, held, jobs, placed):
    tree = QueueTree(orgs={"o": OrgQuota(limit_gpus=org_limit, teams={"t": TeamQuota(limit_gpus=team_limit)})})
    c = Cluster()
    if held:
        c.hold("t", held)
    for i, gpus in enumerate(jobs):
        c.submit(f"j{i}", "t", gpus)
    decisions = Scheduler(SchedulerConfig(queue=queue, quotas=tree)).cycle(c.state, 100.0, CycleMemory())
    assert len(decisions) == placed
    held_after = held * 1000 + sum(c.state.jobs[d.job_id].milli for d in decisions)
    limit = min(x for x in (team_limit, org_limit, 10_000) if x is not None)
    assert held_after <= limit * 1000


def test_within_limits_counts_the_reserved_head_of_line():
    tree = QueueTree(orgs={"o": OrgQuota(teams={"t": TeamQuota(limit_gpus=8)})})
    c = Cluster()
    c.submit("head", "t", 6)
    c.submit("small", "t", 4)
    head, small = c.state.jobs["head"], c.state.jobs["small"]
    assert within_limits(c.state, tree, small)
    assert not within_limits(c.state, tree, small, reserved=head)


# --- configuration --------------------------------------------------------------------
def test_queue_tree_loads_from_json_and_round_trips():
    text = json.dumps({"orgs": {"research": {"guaranteed_gpus": 16, "teams": {
        "llm": {"guaranteed_gpus": 12, "limit_gpus": 24, "weight": 2}}}},
        "default_team": {"limit_gpus": 4}})
    tree = QueueTree.from_json(text)
    assert tree.team_quota("llm") == TeamQuota(12, 24, 2)
    assert tree.org_of("llm") == "research" and tree.org_of("nobody") == ""
    assert tree.team_quota("nobody") == TeamQuota(limit_gpus=4)
    assert QueueTree.from_dict(tree.to_dict()) == tree
    assert pickle.loads(pickle.dumps(tree)) == tree      # configs travel to worker processes


@pytest.mark.parametrize("data", [
    {"orgs": {"o": {"teams": {"t": {"guaranteed_gpus": 8, "limit_gpus": 4}}}}},     # limit < guarantee
    {"orgs": {"o": {"teams": {"t": {"weight": 0}}}}},
    {"orgs": {"o": {"teams": {"t": {}}}, "p": {"teams": {"t": {}}}}},               # team in two orgs
    {"orgs": {"o": {"teams": {"t": {"guaranted_gpus": 1}}}}},                       # typo
])
def test_bad_quota_config_is_refused(data):
    with pytest.raises((ValueError, TypeError)):
        QueueTree.from_dict(data)
