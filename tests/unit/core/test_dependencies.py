"""Dependencies (``JobSpec.depends_on``, Slurm's ``--dependency``): a job is not queued
(not in ``ClusterState.pending``, so no policy can place it) until every job it waits for
ended as its condition says; one that can never be met cancels it, and that cascades
down a pipeline. Table cases, then a property: no job is ever placeable early."""
from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.core import events as ev
from gpusched.core.digest import digest
from gpusched.core.model import Dependency, DependencyCondition, JobPhase
from gpusched.core.reducer import apply
from gpusched.core.snapshot import snapshot_bytes, state_from_snapshot
from gpusched.core.state import ClusterState
from tests.unit.core.builders import Log, make_node, make_spec, whole

SUCCEEDED, FINISHED, FAILED = DependencyCondition.SUCCEEDED, DependencyCondition.FINISHED, DependencyCondition.FAILED


def after(*deps: tuple[str, DependencyCondition], team: str = "team-a"):
    return dataclasses.replace(make_spec(team), depends_on=tuple(Dependency(j, w) for j, w in deps))


def end(log: Log, job_id: str, how: str) -> None:
    """Run ``job_id`` on n1 and end it: "ok", "fail" (max_restarts 0), or "cancel"."""
    if how == "cancel":
        assert log(ev.JobCancelled, job_id=job_id, reason="test").accepted
        return
    log.run(job_id, ("n1", whole(0)))
    assert log.finish(job_id, 0, 0 if how == "ok" else 1).accepted


def test_a_pipeline_is_queued_one_step_at_a_time():
    log = Log(make_node("n1", gpus=1))
    log.submit("prep")
    assert log.submit("train", after(("prep", SUCCEEDED))).accepted
    assert log.submit("eval", after(("train", SUCCEEDED))).accepted
    assert list(log.state.pending) == ["prep"]
    assert log.job("train").phase is JobPhase.PENDING and log.job("train").reason == "waits for job prep"
    assert not log.place("train", ("n1", whole(0))).accepted        # not queued: cannot be placed
    end(log, "prep", "ok")
    assert list(log.state.pending) == ["train"]
    end(log, "train", "ok")
    assert list(log.state.pending) == ["eval"] and log.state.dependents == {}


def test_a_condition_that_can_never_be_met_cancels_the_job_and_those_after_it():
    log = Log(make_node("n1", gpus=1))
    log.submit("prep", make_spec(max_restarts=0))
    log.submit("train", after(("prep", SUCCEEDED)))
    log.submit("eval", after(("train", SUCCEEDED)))
    log.submit("report", after(("train", FINISHED)))     # afterany: runs however train ended
    log.submit("cleanup", after(("prep", FAILED)))
    log.run("prep", ("n1", whole(0)))
    out = log.finish("prep", 0, 1)
    assert set(out.jobs) == {"prep", "train", "eval", "report", "cleanup"}   # what watchers are told changed
    assert log.job("train").phase is JobPhase.CANCELLED
    assert log.job("train").reason == "dependency never met: job prep ended failed, not succeeded"
    assert log.job("eval").phase is JobPhase.CANCELLED                  # down the pipeline
    assert log.job("eval").reason == "dependency never met: job train ended cancelled, not succeeded"
    assert list(log.state.pending) == ["report", "cleanup"]


def test_finished_is_met_by_any_end_and_failed_by_failure_or_timeout():
    assert all(Dependency("x", FINISHED).met_by(p) for p in JobPhase if p.terminal)
    assert {p for p in JobPhase if Dependency("x", FAILED).met_by(p)} == {JobPhase.FAILED, JobPhase.TIMEOUT}
    assert {p for p in JobPhase if Dependency("x", SUCCEEDED).met_by(p)} == {JobPhase.SUCCEEDED}


def test_dependencies_already_met_or_broken_at_submission():
    log = Log(make_node("n1", gpus=1))
    log.submit("a")
    end(log, "a", "ok")
    assert log.submit("b", after(("a", SUCCEEDED))).accepted and "b" in log.state.pending
    assert log.submit("c", after(("a", FAILED))).accepted
    assert log.job("c").phase is JobPhase.CANCELLED


def test_unknown_jobs_and_other_teams_jobs_are_refused():
    log = Log(make_node("n1", gpus=1))
    log.submit("theirs", make_spec("team-b"))
    assert "no job 'ghost'" in log.submit("x", after(("ghost", SUCCEEDED))).reason
    assert "another team" in log.submit("y", after(("theirs", SUCCEEDED))).reason
    assert "x" not in log.state.jobs and "y" not in log.state.jobs


def test_a_waiting_job_survives_a_snapshot():
    log = Log(make_node("n1", gpus=1))
    log.submit("a")
    log.submit("b", after(("a", SUCCEEDED)))
    restored = state_from_snapshot(snapshot_bytes(log.state))
    assert digest(restored) == digest(log.state)
    assert restored.dependents == {"a": ("b",)} and restored.jobs["b"].waiting_for == ("a",)


@settings(max_examples=120, deadline=None)
@given(st.lists(st.tuples(st.lists(st.tuples(st.integers(0, 20), st.sampled_from(list(DependencyCondition))),
                                   max_size=3),
                          st.sampled_from(["ok", "fail", "cancel"])), min_size=1, max_size=8),
       st.randoms(use_true_random=False))
def test_no_job_is_ever_queued_before_its_dependencies_are_met(jobs, rng):
    log = Log(make_node("n1", gpus=1))
    fate = {}
    for i, (deps, how) in enumerate(jobs):
        known = [(f"j{d % i}", w) for d, w in deps] if i else []
        known = list(dict(known).items())      # one condition per job
        spec = dataclasses.replace(make_spec(max_restarts=0), depends_on=tuple(Dependency(j, w) for j, w in known))
        assert log.submit(f"j{i}", spec).accepted
        fate[f"j{i}"] = how
    while log.state.pending:
        job_id = rng.choice(list(log.state.pending))
        for dep in log.job(job_id).spec.depends_on:    # queued: every dependency met
            assert dep.met_by(log.job(dep.job).phase), (job_id, dep)
        end(log, job_id, fate[job_id])
    for job_id, job in log.state.jobs.items():        # nothing is left waiting for ever
        assert job.phase.terminal, (job_id, job.phase, job.waiting_for)
    assert log.state.dependents == {}
    replayed = ClusterState()
    replayed.pools["default"] = None
    for e in log.events:
        apply(replayed, e)
    assert digest(replayed) == digest(log.state)
