"""Retries by cause (``JobSpec.retry``): the first matching rule decides whether a failed
attempt fails the job at once, is placed again counted (against the rule's own budget or
the job's ``max_restarts``), or is placed again uncounted; unmatched, the job's own
faults (exit, oom, hang) count and the cluster's (node, preemption) do not. Table cases,
then a property over random policies and failures."""
from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.core import events as ev
from gpusched.core.model import EXIT_LOST, FailureCause, JobPhase, RetryAction, RetryRule
from gpusched.core.validation import check_spec_alone
from tests.unit.core.builders import Log, make_node, make_spec, whole

EXIT, OOM, HANG, NODE, PREEMPTION = (FailureCause.EXIT, FailureCause.OOM, FailureCause.HANG, FailureCause.NODE,
                                     FailureCause.PREEMPTION)
COUNT, IGNORE, FAIL = RetryAction.COUNT, RetryAction.IGNORE, RetryAction.FAIL


def fail(log: Log, cause: FailureCause, code: int = 1) -> None:
    """The live attempt of job j fails for ``cause``, as the services would report it."""
    job = log.job("j")
    if cause is EXIT or cause is OOM:
        out = log(ev.WorkerFinished, job_id="j", attempt=job.attempt, worker=0, node="n1", exit_code=code,
                  signal=9 if cause is OOM else 0, oom_killed=cause is OOM)
    elif cause is NODE:
        out = log.finish("j", 0, EXIT_LOST)
    elif cause is HANG:
        out = log(ev.AttemptFailed, job_id="j", attempt=job.attempt, reason="no progress")
    else:
        out = log(ev.JobPreempted, job_id="j", attempt=job.attempt, for_job="other", reason="preempted")
    assert out.accepted, out.reason
    if log.job("j").phase in (JobPhase.STOPPING, JobPhase.PREEMPTING):
        log.stopped("j")


def job_with(*rules: RetryRule, max_restarts: int = 2) -> Log:
    log = Log(make_node("n1", gpus=1))
    spec = dataclasses.replace(make_spec(max_restarts=max_restarts), retry=rules)
    assert check_spec_alone(spec) == []
    assert log.submit("j", spec).accepted
    return log


def run(log: Log) -> None:
    log.job("j").not_before = 0.0      # past its back-off: the clock here is the log's
    log.run("j", ("n1", whole(0)))


def test_a_fatal_exit_code_fails_the_job_at_once():
    log = job_with(RetryRule(EXIT, (2,), FAIL), max_restarts=3)
    run(log)
    fail(log, EXIT, 2)
    job = log.job("j")
    assert job.phase is JobPhase.FAILED and job.restarts == 0
    assert "retry policy" in job.reason
    assert [(f.cause, f.exit_code, f.counted) for f in job.failures] == [(EXIT, 2, False)]


def test_other_exit_codes_count_against_max_restarts():
    log = job_with(RetryRule(EXIT, (2,), FAIL), max_restarts=1)
    run(log)
    fail(log, EXIT, 1)
    assert log.job("j").phase is JobPhase.PENDING and log.job("j").restarts == 1
    run(log)
    fail(log, EXIT, 1)
    job = log.job("j")
    assert job.phase is JobPhase.FAILED and "restart budget spent" in job.reason
    assert [f.counted for f in job.failures] == [True, True]


def test_a_rule_with_its_own_budget_leaves_the_jobs_alone():
    log = job_with(RetryRule(OOM, (), COUNT, 2), max_restarts=0)
    for _ in range(2):
        run(log)
        fail(log, OOM, 137)
        assert log.job("j").phase is JobPhase.PENDING
    assert log.job("j").rule_restarts == {0: 2} and log.job("j").restarts == 0
    run(log)
    fail(log, OOM, 137)
    assert log.job("j").phase is JobPhase.FAILED


def test_node_faults_and_preemptions_are_free_by_default_and_exits_are_not():
    log = job_with(max_restarts=0)
    for cause in (NODE, PREEMPTION, NODE):
        run(log)
        fail(log, cause)
        assert log.job("j").phase is JobPhase.PENDING, cause
    assert log.job("j").restarts == 0 and [f.cause for f in log.job("j").failures] == [NODE, PREEMPTION, NODE]
    run(log)
    fail(log, HANG)
    assert log.job("j").phase is JobPhase.FAILED


def test_a_rule_may_count_node_faults_or_refuse_preemption():
    log = job_with(RetryRule(NODE, (), COUNT, 1), RetryRule(PREEMPTION, (), FAIL))
    run(log)
    fail(log, NODE)
    run(log)
    fail(log, NODE)
    assert log.job("j").phase is JobPhase.FAILED
    log = job_with(RetryRule(PREEMPTION, (), FAIL))
    run(log)
    fail(log, PREEMPTION)
    assert log.job("j").phase is JobPhase.FAILED and log.job("j").preemptions == 1


def test_an_ignored_exit_is_retried_for_ever():
    log = job_with(RetryRule(EXIT, (75,), IGNORE), max_restarts=0)
    for _ in range(5):
        run(log)
        fail(log, EXIT, 75)
    assert log.job("j").phase is JobPhase.PENDING and log.job("j").restarts == 0


causes = st.sampled_from([EXIT, OOM, HANG, NODE, PREEMPTION])
rules = st.builds(RetryRule, causes, st.lists(st.integers(1, 4), max_size=2).map(tuple),
                  st.sampled_from(list(RetryAction)), st.integers(0, 2)).filter(
    lambda r: (not r.exit_codes or r.cause is EXIT) and (not r.max_restarts or r.action is COUNT))


@settings(max_examples=150, deadline=None)
@given(st.lists(rules, max_size=4).map(tuple), st.integers(0, 3),
       st.lists(st.tuples(causes, st.integers(1, 4)), min_size=1, max_size=12))
def test_the_first_matching_rule_decides_and_no_budget_is_overspent(policy, max_restarts, failures):
    log = job_with(*policy, max_restarts=max_restarts)
    spec = log.job("j").spec
    for cause, code in failures:
        if log.job("j").phase.terminal:
            break
        before = dataclasses.replace(log.job("j"), rule_restarts=dict(log.job("j").rule_restarts))
        run(log)
        fail(log, cause, code)
        job = log.job("j")
        index, action = spec.retry_rule(cause, code)
        assert all(not r.matches(cause, code) for r in policy[:max(index, 0)])   # the first match decides
        last = job.failures[-1]
        assert (last.cause, last.attempt) == (cause, before.attempt)
        if action is FAIL:
            assert job.phase is JobPhase.FAILED and not last.counted
        elif action is IGNORE:
            assert job.phase is JobPhase.PENDING and not last.counted
            assert (job.restarts, job.rule_restarts) == (before.restarts, before.rule_restarts)
        else:
            assert last.counted
            assert job.phase in (JobPhase.PENDING, JobPhase.FAILED)
        # no budget is ever overspent
        assert job.restarts <= max_restarts
        assert all(n <= policy[i].max_restarts for i, n in job.rule_restarts.items())
    assert len(log.job("j").failures) <= len(failures)
