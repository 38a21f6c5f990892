"""Parking jobs known not to fit (``gpusched.policies.queueing.parking``): when the parked set
holds, when it is dropped, and that a cycle then offers only the newcomers."""
from __future__ import annotations

import math

import pytest

from gpusched.core import events as ev
from gpusched.policies.memory import CycleMemory
from gpusched.policies.queueing.parking import MAX_PARKED_S
from gpusched.policies.scheduler import Scheduler, SchedulerConfig
from tests.unit.core.builders import Log, make_node, whole
from tests.unit.policies.shape_skim import offer_every_shape

# Parking applies without a reservation stage: the old defaults, named.
NO_RESERVATIONS = SchedulerConfig(queue="priority", backfill=False, reserve_after_s=math.inf)


def full_cluster(jobs: int = 50) -> Log:
    """Two 2-GPU nodes, both full, and ``jobs`` one-GPU jobs waiting."""
    log = Log(make_node("n1", 2), make_node("n2", 2))
    for i, node in enumerate(["n1", "n1", "n2", "n2"]):
        log.submit(f"run{i}", gpus=1)
        log.run(f"run{i}", (node, whole(i % 2)))
    for i in range(jobs):
        log.submit(f"wait{i}", gpus=1)
    return log


def cycle(log: Log, scheduler: Scheduler, memory: CycleMemory) -> list[str]:
    return [d.job_id for d in scheduler.cycle(log.state, log.now, memory)]


def offered(scheduler: Scheduler, log: Log, memory: CycleMemory, monkeypatch) -> list[str]:
    """Job ids the next cycle offers, in order (by wrapping the cycle's ``offer``), every
    job not parked (none skipped for a shape that failed)."""
    from gpusched.policies.scheduler import _Cycle
    seen: list[str] = []
    real = _Cycle.offer

    def spy(run, job, *shape):
        seen.append(job.job_id)
        return real(run, job, *shape)
    with monkeypatch.context() as patch:
        patch.setattr(_Cycle, "offer", spy)
        offer_every_shape(patch)
        cycle(log, scheduler, memory)
    return seen


def test_a_full_cluster_parks_its_backlog_and_later_cycles_offer_only_newcomers(monkeypatch):
    log, scheduler, memory = full_cluster(), Scheduler(NO_RESERVATIONS), CycleMemory()
    assert cycle(log, scheduler, memory) == []
    assert memory.parked.jobs == {f"wait{i}" for i in range(50)}
    log.submit("late", gpus=1)
    assert offered(scheduler, log, memory, monkeypatch) == ["late"]
    assert "late" in memory.parked.jobs


@pytest.mark.parametrize("frees", [
    lambda log: log.finish("run0", 0, 0),                                     # a job ends
    lambda log: log(ev.NodeRegistered, node=make_node("n3", 1)),              # a node joins
    lambda log: (log(ev.JobCancelled, job_id="run1", reason="user"),          # a running job is cancelled
                 log.stopped("run1")),                                        # and its worker is gone
])
def test_capacity_growing_moves_the_epoch_and_everything_is_offered_again(frees, monkeypatch):
    log, scheduler, memory = full_cluster(5), Scheduler(NO_RESERVATIONS), CycleMemory()
    cycle(log, scheduler, memory)
    epoch = log.state.capacity_epoch
    frees(log)
    assert log.state.capacity_epoch > epoch
    assert offered(scheduler, log, memory, monkeypatch)[:1] == ["wait0"]


def test_taking_capacity_keeps_the_epoch():
    log = full_cluster(0)
    epoch = log.state.capacity_epoch
    log.submit("more", gpus=1)
    assert log(ev.NodeCordoned, node="n1").accepted
    assert log.state.capacity_epoch == epoch


def test_a_decision_not_applied_drops_the_parked_set():
    """wait1 failed only because wait0 was decided first; wait0's proposal never made it
    to the log, so wait1 may fit now."""
    log = Log(make_node("n1", 1))
    log.submit("wait0", gpus=1)
    log.submit("wait1", gpus=1)
    scheduler, memory = Scheduler(NO_RESERVATIONS), CycleMemory()
    assert cycle(log, scheduler, memory) == ["wait0"]
    assert memory.parked.jobs == {"wait1"} and list(memory.parked.decided) == ["wait0"]
    assert log(ev.JobCancelled, job_id="wait0", reason="user").accepted   # pending: frees nothing
    assert cycle(log, scheduler, memory) == ["wait1"]


def test_a_job_placed_elsewhere_than_decided_drops_the_parked_set():
    """Another proposal for wait0 won (a second replica, say) and put it on n2: the GPU
    wait1 yielded to on n1 is free."""
    log = Log(make_node("n1", 1), make_node("n2", 1))
    log.submit("hog", gpus=1)
    log.run("hog", ("n2", whole(0)))
    log.submit("wait0", gpus=1)
    log.submit("wait1", gpus=1)
    scheduler, memory = Scheduler(NO_RESERVATIONS), CycleMemory()
    [decision] = scheduler.cycle(log.state, log.now, memory)
    assert decision.workers[0].node == "n1" and memory.parked.jobs == {"wait1"}
    log.finish("hog", 0, 0)
    assert log.place("wait0", ("n2", whole(0))).accepted   # frees n2, takes it again: the epoch moved once
    memory.parked.epoch = log.state.capacity_epoch                  # as if no release had happened
    assert [d.job_id for d in scheduler.cycle(log.state, log.now, memory)] == ["wait1"]


def test_an_applied_decision_keeps_the_parked_set(monkeypatch):
    log = Log(make_node("n1", 1))
    log.submit("wait0", gpus=1)
    log.submit("wait1", gpus=1)
    scheduler, memory = Scheduler(NO_RESERVATIONS), CycleMemory()
    [decision] = scheduler.cycle(log.state, log.now, memory)
    assert log(ev.JobPlaced, job_id="wait0", attempt=0, workers=decision.workers).accepted
    assert offered(scheduler, log, memory, monkeypatch) == []
    assert memory.parked.jobs == {"wait1"} and memory.parked.decided == {}


@pytest.mark.parametrize("config, nominate", [
    (SchedulerConfig(backfill=True), False),     # a reservation decides what others may use
    (SchedulerConfig(backfill=False), False),    # so does one made after a wait bound
    (NO_RESERVATIONS, True),                     # nominations hold nodes, with no epoch
])
def test_no_parking_with_backfill_or_nominations(config, nominate, monkeypatch):
    log, scheduler, memory = full_cluster(3), Scheduler(config), CycleMemory()
    if nominate:
        assert log(ev.JobPreempted, job_id="run0", attempt=0, for_job="wait0", reason="test").accepted
    cycle(log, scheduler, memory)
    assert memory.parked.jobs == set()
    assert set(offered(scheduler, log, memory, monkeypatch)) >= {"wait1", "wait2"}


def test_ids_that_left_the_queue_are_dropped_from_a_large_parked_set():
    log, scheduler, memory = full_cluster(100), Scheduler(NO_RESERVATIONS), CycleMemory()
    cycle(log, scheduler, memory)
    for i in range(100):
        assert log(ev.JobCancelled, job_id=f"wait{i}", reason="user").accepted
    log.submit("last", gpus=1)
    cycle(log, scheduler, memory)
    assert memory.parked.jobs == {"last"}


def test_a_parked_set_is_dropped_after_max_parked_s(monkeypatch):
    """Like Kubernetes' flush of unschedulable pods: everything is offered again after a
    while, even if capacity never grew (a policy's false "does not fit" heals)."""
    log, scheduler, memory = full_cluster(3), Scheduler(NO_RESERVATIONS), CycleMemory()
    cycle(log, scheduler, memory)
    log.now += MAX_PARKED_S / 2
    assert offered(scheduler, log, memory, monkeypatch) == []
    log.now += MAX_PARKED_S / 2
    assert offered(scheduler, log, memory, monkeypatch) == ["wait0", "wait1", "wait2"]
