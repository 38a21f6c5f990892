"""The placer writes a job's pending reason only when it changes, at most once every few
seconds per job, within a budget of looks per pass and of events per second."""
from __future__ import annotations

from gpusched.core import events as ev
from gpusched.core.model import PendingKind
from gpusched.core.policy import Quota
from gpusched.core.reducer import apply
from gpusched.policies.scheduler import Scheduler, SchedulerConfig
from gpusched_placer.loop import PlacementDecider
from gpusched_placer.reasons import PendingReasons
from tests.unit.core.builders import Log, make_node, make_spec, whole, workers


def cluster(jobs: int = 1, gpus: int = 8) -> tuple[Log, PlacementDecider]:
    log = Log(make_node("n1", gpus=4), make_node("n2", gpus=4))
    for i in range(jobs):
        log(ev.JobSubmitted, job_id=f"j{i}", spec=make_spec(gpus=gpus + i))   # a shape each
    return log, PlacementDecider(Scheduler(), "placer-test")


def round_(log: Log, decider: PlacementDecider, now: float) -> list[ev.Event]:
    """One proposer round: decide, then fold what was written (as the log would)."""
    events = [e for e, _ in decider(0, log.state, now)]
    for e in events:
        assert apply(log.state, e).accepted
    return events


def test_written_once_then_only_when_it_changes():
    log, decider = cluster()
    first = round_(log, decider, 100.0)
    assert [(type(e), e.reason.kind) for e in first] == [(ev.JobPendingReason, PendingKind.NO_FIT)]
    assert log.state.jobs["j0"].pending_reason.summary == "0/2 nodes are available: 2 not enough free GPUs."
    assert round_(log, decider, 101.0) == []          # the same reason: nothing written
    assert round_(log, decider, 110.0) == []
    log(ev.NodeCordoned, node="n2")
    changed = round_(log, decider, 111.0)
    assert [e.reason.summary for e in changed] == ["0/2 nodes are available: 1 cordoned, 1 not enough free GPUs."]


def test_a_change_within_the_interval_is_held_back_then_written():
    log, decider = cluster()
    round_(log, decider, 100.0)
    log(ev.NodeCordoned, node="n2")
    assert round_(log, decider, 101.0) == []           # within 5 s of the last write
    assert decider.reasons.due(0, log.state, 104.0) is False
    assert decider.reasons.due(0, log.state, 105.0) is True      # the placer looks again though the state is the same
    later = round_(log, decider, 105.0)
    assert [e.reason.counts[0].filter for e in later] == ["cordoned"]
    assert decider.reasons.due(0, log.state, 200.0) is False


def test_a_pass_looks_at_a_bounded_number_of_jobs_new_ones_first():
    log, decider = cluster(jobs=5)
    decider.reasons = PendingReasons("placer-test", per_pass=2)
    assert [e.job_id for e in round_(log, decider, 100.0)] == ["j0", "j1"]
    assert decider.reasons.due(0, log.state, 100.0)
    assert [e.job_id for e in round_(log, decider, 100.5)] == ["j2", "j3"]
    assert [e.job_id for e in round_(log, decider, 101.0)] == ["j4"]
    # j4's reason changed the state: the queue is looked at again, two jobs a pass, and
    # nothing is written since nothing changed for them
    assert [round_(log, decider, t) for t in (102.0, 102.5, 103.0)] == [[], [], []]
    assert not decider.reasons.due(0, log.state, 103.5)


def test_a_pass_checks_a_bounded_number_of_nodes_the_rest_first_next_time():
    log, decider = cluster(jobs=5)   # a shape each, 2 nodes: a scan of 2 nodes each
    decider.reasons = PendingReasons("placer-test", per_pass=3, node_checks_per_pass=4)
    assert [e.job_id for e in round_(log, decider, 100.0)] == ["j0", "j1"]   # j2 chosen, not reached
    assert decider.reasons.due(0, log.state, 100.0)
    log(ev.JobSubmitted, job_id="j5", spec=make_spec(gpus=20))   # new: after those not reached
    assert [e.job_id for e in round_(log, decider, 100.5)] == ["j2", "j3"]
    assert [e.job_id for e in round_(log, decider, 101.0)] == ["j4", "j5"]


def test_a_pass_over_the_node_budget_still_looks_at_one_shape():
    log, decider = cluster(jobs=2)
    decider.reasons = PendingReasons("placer-test", node_checks_per_pass=1)
    assert [e.job_id for e in round_(log, decider, 100.0)] == ["j0"]
    assert [e.job_id for e in round_(log, decider, 100.5)] == ["j1"]


def test_events_per_second_are_bounded():
    log, decider = cluster(jobs=5)
    decider.reasons = PendingReasons("placer-test", rate_per_s=2.0)
    assert len(round_(log, decider, 100.0)) == 2
    assert len(round_(log, decider, 100.1)) == 0
    assert len(round_(log, decider, 101.1)) == 2


def test_placed_jobs_get_no_reason():
    log, decider = cluster(jobs=2, gpus=3)   # j0 (3 GPUs) fits, j1 (4) fits too, on the other node
    assert [type(e).__name__ for e in round_(log, decider, 100.0)] == ["JobPlaced", "JobPlaced"]


def test_a_requeued_job_gets_its_reason_within_a_full_check():
    """Requeued jobs re-enter the queue without a new submission: the periodic comparison
    of the whole queue finds them."""
    log = Log(make_node("n1", gpus=4))
    log(ev.JobSubmitted, job_id="j", spec=make_spec(gpus=4))
    log(ev.JobSubmitted, job_id="big", spec=make_spec(gpus=8))   # never fits: the queue is never empty
    decider = PlacementDecider(Scheduler(), "placer-test")
    assert [type(e).__name__ for e in round_(log, decider, 100.0)] == ["JobPlaced", "JobPendingReason"]
    round_(log, decider, 100.5)   # j placed, as the log says: nothing to say about it
    assert log(ev.GpuHealthChanged, node="n1", gpu_index=0, healthy=False).accepted   # requeued, GPUs kept
    assert log(ev.WorkerFinished, job_id="j", attempt=0, worker=0, node="n1", exit_code=-2).accepted
    assert log.state.jobs["j"].attempt == 1
    written = [e for t in range(1, 40) for e in round_(log, decider, 100.0 + t) if e.job_id == "j"]
    assert [(e.attempt, e.reason.counts[0].filter) for e in written] == [(1, "gpus")]


def test_a_job_the_guarantee_hold_keeps_back_is_told_so():
    """The reason comes from the cycle's own verdict (its ``CycleResult``): team g,
    guaranteed 4 GPUs (the log's quota) and using none, waits with a 2x4 gang; team t's
    1-GPU job would borrow from the 4 GPUs left, which g keeps back."""
    log = Log(make_node("n1", gpus=4), make_node("n2", gpus=4))
    log(ev.QuotaSet, quota=Quota(org="o", team="g", guaranteed_milli=4000))
    log(ev.JobSubmitted, job_id="busy", spec=make_spec("other", gpus=4))
    log(ev.JobPlaced, job_id="busy", attempt=0, workers=workers(("n1", whole(0, 1, 2, 3))))
    log(ev.JobSubmitted, job_id="gang", spec=make_spec("g", gpus=4, workers=2))
    log(ev.JobSubmitted, job_id="borrower", spec=make_spec("t", gpus=1))
    decider = PlacementDecider(Scheduler(SchedulerConfig(queue="fifo", reservation_depth=0)), "placer-test")
    written = {e.job_id: e.reason for e in round_(log, decider, 100.0)}
    assert written["borrower"].kind is PendingKind.GUARANTEE
    assert "guarantee hold" in written["borrower"].summary and written["gang"].kind is PendingKind.GANG
