"""Schedulers take quotas, weights and fair share's usage ledger from the folded log:
the quota tree of a state, the bootstrap file as events, and a queue order that a
replica rebuilt from the log (or a snapshot) computes alike."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpusched.core import events as ev
from gpusched.core.policy import NO_LIMIT, Quota, TeamPolicy
from gpusched.core.reducer import apply
from gpusched.core.snapshot import snapshot_bytes, state_from_snapshot
from gpusched.core.state import ClusterState
from gpusched.policies.memory import CycleMemory
from gpusched.policies.queueing.fairshare import QueueContext, fair_share
from gpusched.policies.queueing.policy_tree import bootstrap_events, policy_tree, tree_of
from gpusched.policies.queueing.quota import QueueTree
from gpusched.policies.scheduler import Scheduler, SchedulerConfig
from gpusched.policies.queueing.usage import Demand, UsageLedger, folded_decay
from gpusched.policies.preemption.victim_rules import PreemptionConfig
from tests.unit.core.builders import Log, make_node, make_spec, whole

FILE = {"orgs": {
    "ml": {"guaranteed_gpus": 12, "limit_gpus": 20, "weight": 2.0, "teams": {
        "llm": {"guaranteed_gpus": 8, "limit_gpus": 16, "weight": 3.0},
        "vision": {"guaranteed_gpus": 4, "borrowing": False}}},
    "web": {"teams": {"search": {"guaranteed_gpus": 2, "lending_limit_gpus": 1}}},
}, "default_team": {"limit_gpus": 4}}


def folded(events) -> ClusterState:
    state = ClusterState()
    for e in events:
        assert apply(state, e).accepted
    return state


def test_bootstrap_file_folds_into_the_same_tree():
    state = folded(bootstrap_events(FILE, "admission", 1.0, 0))
    assert tree_of(state).to_dict() == QueueTree.from_dict(FILE).to_dict()


def test_bootstrap_ids_repeat_so_two_writers_fold_once():
    a, b = bootstrap_events(FILE, "x", 1.0, 0), bootstrap_events(FILE, "y", 2.0, 0)
    assert [e.event_id for e in a] == [e.event_id for e in b]
    assert [e.event_id for e in a] != [e.event_id for e in bootstrap_events(FILE, "x", 1.0, 1)]


def test_borrowing_off_caps_the_limit_at_the_guarantee():
    tree = tree_of(folded(bootstrap_events(FILE, "a", 1.0, 0)))
    assert tree.team_quota("vision").limit_milli == 4000
    assert tree.team_quota("llm").limit_milli == 16000
    assert tree.team_quota("stranger").limit_milli == 4000   # the default team's


def test_weight_without_quota_keeps_the_default_quota():
    state = folded([ev.QuotaSet(event_id="q", quota=Quota("", "*", 0, 2000)),
                    ev.TeamPolicySet(event_id="p", policy=TeamPolicy("interns", 0.5))])
    q = tree_of(state).team_quota("interns")
    assert (q.weight, q.limit_milli) == (0.5, 2000)


def test_the_logs_tree_wins_over_the_callers_once_set():
    fallback = QueueTree.from_dict({"default_team": {"limit_gpus": 1}})
    empty = ClusterState()
    assert policy_tree(empty, fallback) is fallback
    state = folded([ev.QuotaSet(event_id="q", quota=Quota("", "*", 0, NO_LIMIT))])
    assert policy_tree(state, fallback).default_team.limit_gpus is None


def _pool() -> Log:
    log = Log(make_node("n1", gpus=8), make_node("n2", gpus=8))
    return log


@pytest.mark.parametrize("queue", ["fair-share", "priority"])
def test_a_quota_change_in_the_log_changes_the_next_cycle(queue):
    log = _pool()
    log(ev.QuotaSet, quota=Quota("", "*", 0, 2000))            # every team: at most 2 GPUs
    assert log.submit("a1", team="a", gpus=2).accepted
    log.run("a1", ("n1", whole(0, 1)))
    assert log.submit("a2", team="a", gpus=2).accepted
    scheduler = Scheduler(SchedulerConfig(queue=queue))
    memory = CycleMemory()                                    # kept between cycles, as the placer does
    assert scheduler.cycle(log.state, log.now, memory) == []                # over its limit: parked
    log(ev.QuotaSet, quota=Quota("", "a", 0, 4000))            # team a: 4 GPUs
    assert [d.job_id for d in scheduler.cycle(log.state, log.now, memory)] == ["a2"]


def test_the_preemptor_reads_guarantees_from_the_log():
    from gpusched_preemptor.decide import PreemptorDecider
    from gpusched.policies.supervision import SupervisionConfig
    state = folded([ev.QuotaSet(event_id="q", quota=Quota("", "b", 3000))])
    decider = PreemptorDecider("p", PreemptionConfig(), SupervisionConfig(), lambda now: ({}, 0.0, False))
    assert decider._config(state).guaranteed_milli("b") == 3000
    assert decider._config(ClusterState()).guaranteed_milli("b") == 0


# --- the usage ledger is folded state ---------------------------------------------------
def _usage_log(half_life: float = 100.0) -> Log:
    log = Log(make_node("n1", gpus=8), make_node("n2", gpus=8))
    log.state.ledger_half_life_s = half_life
    return log


@pytest.mark.parametrize("elapsed, expected_gpus", [(0.0, 8.0), (100.0, 4.0), (200.0, 2.0), (300.0, 1.0)])
def test_folded_ledger_halves_every_half_life(elapsed, expected_gpus):
    log = _usage_log()
    log.submit("j", team="a", gpus=8)
    log.run("j", ("n1", whole(*range(8))))
    log.now = 10_000.0                                        # held for 100 half-lives
    log.stopped("j", code=0)                                  # released at 10 001
    released = log.now
    decayed = folded_decay(log.state, released + elapsed)
    assert decayed["a"].gpu_milli / 1000 == pytest.approx(expected_gpus, rel=1e-6)


def test_folded_ledger_matches_a_ledger_advanced_at_every_change():
    log = _usage_log()
    memory = UsageLedger(100.0)
    memory.advance(log.state, 0.0)
    for i in range(6):
        log.submit(f"j{i}", team="ab"[i % 2], gpus=2)
        memory.advance(log.state, log.now)
        assert log.place(f"j{i}", (f"n{1 + i % 2}", whole(2 * (i // 2), 2 * (i // 2) + 1))).accepted
        memory.advance(log.state, log.now)   # at the placement's time: exact
        log.start_all(f"j{i}")
        log.now += 37.0 * i
    log.stopped("j0", code=0)
    memory.advance(log.state, log.now)
    later = log.now + 55.0
    memory.advance(log.state, later)
    want, got = memory.decayed(), folded_decay(log.state, later)
    assert set(want) == set(got)
    for team in want:
        assert got[team].gpu_milli == pytest.approx(want[team].gpu_milli, rel=1e-9)
        assert got[team].cpu_milli == pytest.approx(want[team].cpu_milli, rel=1e-9)


def test_queue_order_comes_from_the_folded_ledger():
    # Team a held 8 GPUs for a long time and released them; b never held anything.
    # Right after, a's decayed usage puts b first; the scheduler sees it with no
    # memory of its own (a fresh Scheduler, as on a placer that just took over).
    log = _usage_log(half_life=1000.0)
    log.submit("big", team="a", gpus=8)
    log.run("big", ("n1", whole(*range(8))))
    log.now = 50_000.0
    log.stopped("big", code=0)
    log.submit("a-job", team="a", gpus=8)
    log.submit("b-job", team="b", gpus=8)
    fresh = Scheduler(SchedulerConfig(queue="fair-share", aging_s=1e9))
    assert [d.job_id for d in fresh.cycle(log.state, log.now + 1, CycleMemory())][:1] == ["b-job"]
    # Without the ledger (what a fresh in-memory ledger knew) a's job, older, went first.
    pending = [log.state.jobs[j] for j in log.state.pending]
    assert fair_share(log.state, pending, log.now + 1, QueueContext(aging_s=1e9))[0].job_id == "a-job"


def test_tentative_bookings_leave_the_ledger_alone():
    log = _usage_log()
    for i in range(3):
        log.submit(f"j{i}", team=f"t{i}", gpus=4)
    before = {t: (e.at, e.gpu_milli) for t, e in log.state.ledger.items()}
    Scheduler(SchedulerConfig(queue="fair-share")).cycle(log.state, log.now + 500, CycleMemory())
    assert {t: (e.at, e.gpu_milli) for t, e in log.state.ledger.items()} == before


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(1, 4), st.floats(0, 500)), min_size=1, max_size=12),
       st.integers(0, 12))
def test_a_replica_from_a_snapshot_orders_the_queue_alike(jobs, cut):
    """What a placer failover does: the new placer folds the log (here: a snapshot plus
    the tail) and its cycle orders the queue as the old one's at the same position."""
    log = _usage_log()
    events_before = len(log.events)
    for i, (team, gpus, gap) in enumerate(jobs):
        log.submit(f"j{i}", team=team, gpus=gpus)
        if i % 3 != 2:   # some run for a while, then end
            node = "n1" if i % 2 else "n2"
            free = [g.info.index for g in log.state.nodes[node].gpus if g.fits_whole()][:gpus]
            if len(free) == gpus:
                log.run(f"j{i}", (node, whole(*free)))
                log.now += gap
                if i % 2:
                    log.stopped(f"j{i}", code=0)
    events = log.events[events_before:]
    other = _usage_log()
    cut = min(cut, len(events))
    for e in events[:cut]:
        other.replay(e)
    restored = state_from_snapshot(snapshot_bytes(other.state))
    for e in events[cut:]:
        apply(restored, e)
    now = log.now + 30.0
    old = [j.job_id for j in fair_share(log.state, [log.state.jobs[j] for j in log.state.pending], now,
                                        QueueContext(decayed=folded_decay(log.state, now)))]
    new = [j.job_id for j in fair_share(restored, [restored.jobs[j] for j in restored.pending], now,
                                        QueueContext(decayed=folded_decay(restored, now)))]
    assert old == new
    assert folded_decay(log.state, now) == folded_decay(restored, now)


def test_demand_zero_for_unknown():
    assert folded_decay(ClusterState(), 10.0) == {}
    assert Demand() == Demand(0.0, 0.0, 0.0)


# --- borrowing and lending ---------------------------------------------------------------
def _two_teams(lender_quota: Quota, gpus: int = 8) -> Log:
    log = Log(make_node("n1", gpus=gpus))
    assert log(ev.QuotaSet, quota=lender_quota).accepted
    return log


def test_a_team_that_does_not_borrow_stays_within_its_guarantee():
    log = _two_teams(Quota("", "a", 2000, NO_LIMIT, False))   # no limit given, but no borrowing
    log.submit("a1", team="a", gpus=2)
    log.submit("a2", team="a", gpus=2)
    assert [d.job_id for d in Scheduler(SchedulerConfig(queue="fair-share")).cycle(log.state, log.now, CycleMemory())] == ["a1"]


@pytest.mark.parametrize("lending, placed", [
    (NO_LIMIT, ["b1", "b2", "b3", "b4"]),   # a lends all of its unused 4 GPUs: b takes the node
    (2000, ["b1", "b2", "b3"]),             # a lends 2 of its 4: 2 GPUs stay free for a
    (0, ["b1", "b2"]),                      # a lends nothing: b keeps to the 4 a did not guarantee
])
def test_a_lending_limit_keeps_part_of_an_unused_guarantee_free(lending, placed):
    log = _two_teams(Quota("", "a", 4000, NO_LIMIT, True, lending))
    for i in (1, 2, 3, 4):
        log.submit(f"b{i}", team="b", gpus=2)
    decisions = Scheduler(SchedulerConfig(queue="fifo")).cycle(log.state, log.now, CycleMemory())
    assert [d.job_id for d in decisions] == placed
    for d in decisions:
        assert log(ev.JobPlaced, job_id=d.job_id, attempt=d.attempt, workers=d.workers).accepted
    if lending == NO_LIMIT:
        return   # the node is full
    # The lender itself is not held back by its own lending limit.
    log.submit("a1", team="a", gpus=2)
    assert "a1" in [d.job_id for d in Scheduler(SchedulerConfig(queue="fifo")).cycle(log.state, log.now, CycleMemory())]


def test_a_node_not_heard_yet_gets_its_timeout_from_when_the_preemptor_first_saw_it():
    # Its beats topic is found by a metadata refresh that can come after its registration.
    from gpusched.policies.supervision import SupervisionConfig
    from gpusched_preemptor.decide import PreemptorDecider
    heard: dict[str, float] = {}
    decider = PreemptorDecider("p", PreemptionConfig(), SupervisionConfig(heartbeat_timeout_s=10.0),
                               lambda now: (heard, 0.0, True))
    state = Log(make_node("n1")).state
    assert decider(0, state, 100.0) == []     # listening since 0, but n1 is new at 100
    assert decider(0, state, 109.0) == []
    (lost,) = decider(0, state, 111.0)
    assert isinstance(lost[0], ev.NodeLost) and lost[0].node == "n1"
    heard["n1"] = 111.0                       # heard at last: its beats count from now on
    assert decider(0, state, 120.0) == [] and not decider.unheard
