"""Job arrays (``JobSpec.array``, Slurm's ``--array=0-N%P``): one submission makes
``count`` tasks ``<id>.<i>``, at most ``parallel`` of them queued or running at once; the
array itself is never placed, ends when its last task ended (succeeded only if each did),
and cancelling it cancels its tasks. Table cases, then a property: the parallel bound
always holds and every task runs once."""
from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.core import events as ev
from gpusched.core.digest import digest
from gpusched.core.model import ArraySpec, Dependency, JobPhase
from gpusched.core.reducer import apply
from gpusched.core.snapshot import snapshot_bytes, state_from_snapshot
from gpusched.core.state import ClusterState
from gpusched.core.validation import check_spec_alone
from tests.unit.core.builders import Log, make_node, make_spec, whole


def array(count: int, parallel: int = 0, **kw):
    return dataclasses.replace(make_spec(max_restarts=0, **kw), array=ArraySpec(count, parallel))


def run_task(log: Log, task: str, code: int = 0) -> None:
    log.run(task, ("n1", whole(0)))
    assert log.finish(task, 0, code).accepted


def test_tasks_are_released_parallel_at_a_time_and_the_array_ends_with_the_last():
    log = Log(make_node("n1", gpus=4))
    out = log.submit("a", array(5, 2))
    assert out.accepted and list(log.state.pending) == ["a.0", "a.1"]
    assert [log.job(f"a.{i}").array_index for i in range(5)] == list(range(5))
    assert not log.place("a", ("n1", whole(0))).accepted          # the array itself is never placed
    assert not log.place("a.3", ("n1", whole(0))).accepted        # nor a task before its turn
    run_task(log, "a.0")
    assert list(log.state.pending) == ["a.1", "a.2"]
    for task in ("a.1", "a.2", "a.3", "a.4"):
        run_task(log, task, 1 if task == "a.3" else 0)
    parent = log.job("a")
    assert parent.phase is JobPhase.FAILED and parent.reason == "1 of 5 tasks did not succeed"
    assert (parent.array_ended, parent.array_failed, parent.array_running) == (5, 1, 0)


def test_all_at_once_and_all_succeeded():
    log = Log(make_node("n1", gpus=4))
    log.submit("a", array(3))
    assert list(log.state.pending) == ["a.0", "a.1", "a.2"]
    for i in range(3):
        run_task(log, f"a.{i}")
    assert log.job("a").phase is JobPhase.SUCCEEDED


def test_cancelling_the_array_stops_its_tasks_and_ends_it_once_they_are_gone():
    log = Log(make_node("n1", gpus=4))
    log.submit("a", array(4, 2))
    log.run("a.0", ("n1", whole(0)))
    out = log(ev.JobCancelled, job_id="a", reason="enough")
    assert {"a", "a.0", "a.1", "a.2", "a.3"} <= set(out.jobs)
    assert log.job("a.0").phase is JobPhase.STOPPING                          # still holds its GPU
    assert all(log.job(f"a.{i}").phase is JobPhase.CANCELLED for i in (1, 2, 3))
    assert log.job("a").phase is JobPhase.PENDING and log.state.pending == {}
    log.stopped("a.0")
    assert log.job("a").phase is JobPhase.CANCELLED and log.job("a").reason == "enough"


def test_one_task_cancelled_lets_the_next_in():
    log = Log(make_node("n1", gpus=4))
    log.submit("a", array(3, 1))
    assert log(ev.JobCancelled, job_id="a.0", reason="bad seed").accepted
    assert list(log.state.pending) == ["a.1"]
    assert log(ev.JobCancelled, job_id="a.2", reason="bad seed").accepted   # cancelled while it waits
    run_task(log, "a.1")
    parent = log.job("a")
    assert parent.phase is JobPhase.FAILED and parent.array_failed == 2


def test_an_array_waits_for_its_dependencies_as_a_whole():
    log = Log(make_node("n1", gpus=4))
    log.submit("prep")
    log.submit("a", dataclasses.replace(array(2), depends_on=(Dependency("prep"),)))
    log.submit("after", dataclasses.replace(make_spec(), depends_on=(Dependency("a"),)))
    assert list(log.state.pending) == ["prep"]
    run_task(log, "prep")
    assert list(log.state.pending) == ["a.0", "a.1"]
    run_task(log, "a.0")
    run_task(log, "a.1")
    assert list(log.state.pending) == ["after"]


def test_bad_arrays_are_refused_naming_the_field():
    assert [e.field for e in check_spec_alone(dataclasses.replace(make_spec(), array=ArraySpec(0, 3)))] == [
        "spec.array.count"]
    assert [e.field for e in check_spec_alone(array(3, 4))] == ["spec.array.parallel"]
    assert [e.field for e in check_spec_alone(array(10_001))] == ["spec.array.count"]


def test_an_array_survives_a_snapshot():
    log = Log(make_node("n1", gpus=4))
    log.submit("a", array(3, 1))
    run_task(log, "a.0")
    restored = state_from_snapshot(snapshot_bytes(log.state))
    assert digest(restored) == digest(log.state)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 8), st.integers(0, 8), st.lists(st.sampled_from(["ok", "fail", "cancel"]), min_size=8,
                                                       max_size=8), st.randoms(use_true_random=False))
def test_never_more_than_parallel_at_once_and_each_task_once(count, parallel, fates, rng):
    parallel = min(parallel, count)
    log = Log(make_node("n1", gpus=1))
    assert log.submit("a", array(count, parallel)).accepted
    ran = []
    while log.state.pending:
        live = [t for t in log.job("a").array_tasks
                if not log.job(t).phase.terminal and not log.job(t).waiting_for]
        assert len(live) <= (parallel or count)
        task = rng.choice(list(log.state.pending))
        fate = fates[log.job(task).array_index]
        if fate == "cancel":
            assert log(ev.JobCancelled, job_id=task, reason="t").accepted
        else:
            run_task(log, task, 0 if fate == "ok" else 1)
            ran.append(task)
    assert len(ran) == len(set(ran))
    parent = log.job("a")
    assert parent.phase.terminal and parent.array_ended == count
    expected = JobPhase.SUCCEEDED if all(f == "ok" for f in fates[:count]) else JobPhase.FAILED
    assert parent.phase is expected
    replayed = ClusterState()
    replayed.pools["default"] = None
    for e in log.events:
        apply(replayed, e)
    assert digest(replayed) == digest(log.state)
