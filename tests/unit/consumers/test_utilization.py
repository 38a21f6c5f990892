"""The utilization fold: allocated vs used GPU-hours and idle jobs, without a broker."""
from __future__ import annotations

import random

import pytest
from hypothesis import given, settings, strategies as st

from gpusched.adapters.nodes.usage_records import UNMEASURED, GpuSample, WorkerUsage
from gpusched.consumers.utilization import UtilizationLedger
from gpusched.core import events as ev
from gpusched.core.model import EXIT_LOST, GpuSlot, JobSpec, WorkerAssignment, WorkerResources
from gpusched.core.reducer import apply
from gpusched.core.state import ClusterState
from tests.unit.core.builders import make_node

_ids = iter(range(10**9))


def usage(job, worker, time, window, *sm, attempt=0, milli=1000, simulated=False, record_id=None):
    gpus = tuple(GpuSample(i, f"GPU-{i}", milli, s) for i, s in enumerate(sm))
    return WorkerUsage(record_id or f"r{next(_ids)}", "n1", "default", job, attempt, worker, time, window,
                       gpus, simulated)


def every(job, worker, start, end, step, *sm, **kw):
    """Samples of one worker over [start, end], one per ``step`` seconds."""
    return [usage(job, worker, t, step, *sm, **kw) for t in range(start + step, end + 1, step)]


def test_half_busy_gpus_for_an_hour_use_half_the_allocated_hours():
    ledger = UtilizationLedger()
    ledger.hold("a", 0, "t1", "p1", workers=1, worker_milli=2000, time=0)
    for u in every("a", 0, 0, 3600, 60, 50.0, 50.0):
        ledger.add(u)
    ledger.release("a", 0, 3600)
    report = ledger.report(now=99_999)
    assert report.jobs["a"].hours.allocated == pytest.approx(2.0)
    assert report.jobs["a"].hours.used == pytest.approx(1.0)
    assert report.teams["t1"].utilization == pytest.approx(0.5)
    assert report.pools["p1"].used == pytest.approx(1.0)
    assert not report.jobs["a"].idle


def test_an_open_allocation_counts_up_to_now_and_samples_after_the_end_do_not_count():
    ledger = UtilizationLedger()
    ledger.hold("a", 0, "t1", "p1", 1, 1000, time=0)
    for u in every("a", 0, 0, 7200, 60, 100.0):
        ledger.add(u)
    assert ledger.report(now=1800).jobs["a"].hours.allocated == pytest.approx(0.5)
    assert ledger.report(now=1800).jobs["a"].hours.used == pytest.approx(0.5)
    ledger.release("a", 0, 3600)
    hours = ledger.report(now=7200).jobs["a"].hours
    assert (hours.allocated, hours.used) == (pytest.approx(1.0), pytest.approx(1.0))


def test_shares_of_one_gpu_split_its_measured_use_by_milli():
    # Two 500-milli tenants of a GPU at 40 % SM: both records read the GPU's 40 %.
    ledger = UtilizationLedger()
    for job in ("s1", "s2"):
        ledger.hold(job, 0, "t1", "p1", 1, 500, time=0)
        for u in every(job, 0, 0, 3600, 60, 40.0, milli=500):
            ledger.add(u)
    report = ledger.report(now=3600)
    assert report.total.allocated == pytest.approx(1.0)
    assert report.total.used == pytest.approx(0.4)
    assert report.jobs["s1"].hours.used == pytest.approx(0.2)


def test_mig_without_an_sm_reading_is_unmeasured_not_used_nor_idle():
    ledger = UtilizationLedger(idle_after_s=60)
    ledger.hold("m", 0, "t1", "p1", 1, 428, time=0)
    for u in every("m", 0, 0, 3600, 60, UNMEASURED, milli=428):
        ledger.add(u)
    job = ledger.report(now=3600).jobs["m"]
    assert job.hours.used == 0
    assert job.hours.unmeasured == pytest.approx(job.hours.allocated)
    assert job.hours.utilization is None
    assert not job.idle


def test_a_job_idle_for_the_threshold_is_flagged_and_idle_now_while_it_holds_gpus():
    ledger = UtilizationLedger(idle_percent=5.0, idle_after_s=600)
    ledger.hold("nb", 0, "t1", "p1", 2, 1000, time=0)
    for worker in (0, 1):
        for u in every("nb", worker, 0, 900, 30, 1.0 + worker):   # 1 % and 2 %: below 5 %
            ledger.add(u)
    job = ledger.report(now=900).jobs["nb"]
    assert job.idle and job.idle_now
    assert job.idle_s == pytest.approx(900)
    ledger.release("nb", 0, 900)
    job = ledger.report(now=1000).jobs["nb"]
    assert job.idle and not job.idle_now


def test_one_busy_sample_of_any_worker_ends_the_idle_stretch():
    ledger = UtilizationLedger(idle_percent=5.0, idle_after_s=600)
    ledger.hold("j", 0, "t1", "p1", 2, 1000, time=0)
    for u in every("j", 0, 0, 1000, 50, 0.0):
        ledger.add(u)
    ledger.add(usage("j", 1, 500, 50, 80.0))   # worker 1 busy around t=500
    job = ledger.report(now=1000).jobs["j"]
    assert job.idle_s == pytest.approx(500)
    assert not job.idle


def test_a_busy_job_is_not_idle():
    ledger = UtilizationLedger(idle_after_s=60)
    ledger.hold("b", 0, "t1", "p1", 1, 1000, time=0)
    for u in every("b", 0, 0, 600, 10, 5.0):   # exactly at the threshold: busy
        ledger.add(u)
    assert ledger.report(now=600).idle_jobs == []


def test_a_duplicated_record_is_folded_once():
    ledger = UtilizationLedger()
    ledger.hold("a", 0, "t1", "p1", 1, 1000, time=0)
    record = usage("a", 0, 60, 60, 100.0)
    assert ledger.add(record) is True
    assert ledger.add(record) is False
    assert ledger.report(now=3600).jobs["a"].hours.used == pytest.approx(60 / 3600)


def test_overlapping_windows_of_one_worker_count_the_time_once():
    # e.g. a restarted agent whose first window reaches back over the old one's
    ledger = UtilizationLedger()
    ledger.hold("a", 0, "t1", "p1", 1, 1000, time=0)
    ledger.add(usage("a", 0, 3600, 3600, 100.0))
    ledger.add(usage("a", 0, 3000, 1200, 100.0))
    ledger.add(usage("a", 0, 3600, 600, 100.0))
    assert ledger.report(now=3600).jobs["a"].hours.used == pytest.approx(1.0)


def test_records_of_attempts_the_log_shows_holding_nothing_are_unattributed():
    ledger = UtilizationLedger()
    ledger.hold("a", 0, "t1", "p1", 1, 1000, time=0)
    ledger.add(usage("a", 1, 60, 60, 100.0))             # worker 1 of a 1-worker job
    ledger.add(usage("ghost", 0, 60, 60, 100.0))
    ledger.add(usage("a", 0, 60, 60, 100.0, attempt=3))
    report = ledger.report(now=60)
    assert report.unattributed == 3
    assert report.jobs["a"].hours.used == 0


@pytest.mark.parametrize("kwargs, field", [
    ({"idle_percent": 101}, "idle_percent"), ({"idle_percent": -1}, "idle_percent"),
    ({"idle_after_s": 0}, "idle_after_s"), ({"idle_after_s": float("nan")}, "idle_after_s"),
])
def test_bad_settings_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        UtilizationLedger(**kwargs)


# --- through the reducer ---------------------------------------------------------------
def _fold_log(events, ledger):
    state = ClusterState()
    for e in events:
        outcome = apply(state, e)
        if outcome.accepted:
            for job_id in outcome.jobs:
                ledger.observe(state.jobs[job_id], e.time)


def _placed(job_id, attempt, time, gpus):
    workers = (WorkerAssignment(0, "n1", tuple(GpuSlot(g) for g in range(gpus))),)
    return ev.JobPlaced(event_id=f"{job_id}p{attempt}", time=time, job_id=job_id, attempt=attempt, workers=workers)


def test_allocation_follows_the_log_across_a_requeue():
    spec = JobSpec("a", "t1", pool="default", resources=WorkerResources(gpus=2))
    log = [ev.NodeRegistered(event_id="n", time=0, node=make_node("n1")),
           ev.JobSubmitted(event_id="s", time=0, job_id="a", spec=spec),
           _placed("a", 0, 100, 2),
           ev.WorkerStarted(event_id="w0", time=110, job_id="a", attempt=0, worker=0, node="n1"),
           # the node lost the worker at 1900: requeued as attempt 1, placed again at 2000
           ev.WorkerFinished(event_id="f0", time=1900, job_id="a", attempt=0, worker=0, node="n1",
                             exit_code=EXIT_LOST),
           _placed("a", 1, 2000, 2),
           ev.WorkerStarted(event_id="w1", time=2010, job_id="a", attempt=1, worker=0, node="n1"),
           ev.WorkerFinished(event_id="f1", time=3800, job_id="a", attempt=1, worker=0, node="n1", exit_code=0)]
    ledger = UtilizationLedger()
    _fold_log(log, ledger)
    for u in every("a", 0, 100, 1900, 60, 100.0, 100.0) + every("a", 0, 2000, 3800, 60, 50.0, 50.0, attempt=1):
        ledger.add(u)
    ledger.add(usage("a", 0, 1990, 60, 100.0, 100.0))   # after attempt 0 ended: not counted
    hours = ledger.report(now=10_000).jobs["a"].hours
    assert hours.allocated == pytest.approx(2 * 3600 / 3600)   # 2 GPUs x (1800 + 1800) s
    assert hours.used == pytest.approx((2 * 1800 + 1 * 1800) / 3600, rel=0.02)


# --- properties --------------------------------------------------------------------------
jobs_st = st.lists(st.tuples(
    st.sampled_from(["t1", "t2", "t3"]), st.sampled_from(["p1", "p2"]),
    st.integers(1, 3), st.sampled_from([250, 500, 1000, 2000, 428]),
    st.floats(0, 1000), st.one_of(st.none(), st.floats(0, 3000)),
), min_size=1, max_size=5)
records_st = st.lists(st.tuples(
    st.integers(0, 3), st.integers(0, 1), st.integers(0, 3),          # job, attempt, worker
    st.floats(1, 3000), st.floats(0.1, 1500),                          # time, window
    st.lists(st.tuples(st.sampled_from([250, 500, 1000]),
                       st.one_of(st.just(UNMEASURED), st.floats(0, 100))), min_size=1, max_size=3),
), max_size=40)


def _ledger(jobs, records, order=None):
    ledger = UtilizationLedger(idle_after_s=100)
    for i, (team, pool, workers, milli, start, length) in enumerate(jobs):
        ledger.hold(f"j{i}", 0, team, pool, workers, milli, start)
        if length is not None:
            ledger.release(f"j{i}", 0, start + length)
    built = [WorkerUsage(f"r{k}", "n1", "p1", f"j{j}", a, w, t, win,
                         tuple(GpuSample(g, "", m, sm) for g, (m, sm) in enumerate(gpus)))
             for k, (j, a, w, t, win, gpus) in enumerate(records)]
    for u in (order(built) if order else built):
        ledger.add(u)
    return ledger


@settings(max_examples=150, deadline=None)
@given(jobs_st, records_st)
def test_used_and_unmeasured_never_exceed_allocated(jobs, records):
    report = _ledger(jobs, records).report(now=6000)
    for job in report.jobs.values():
        h = job.hours
        assert 0 <= h.used and 0 <= h.unmeasured
        assert h.used + h.unmeasured <= h.allocated * (1 + 1e-9) + 1e-12


@settings(max_examples=150, deadline=None)
@given(jobs_st, records_st)
def test_team_and_pool_totals_are_the_sums_over_their_jobs(jobs, records):
    report = _ledger(jobs, records).report(now=6000)
    for group, key in ((report.teams, "team"), (report.pools, "pool")):
        for name, hours in group.items():
            mine = [j.hours for j in report.jobs.values() if getattr(j, key) == name]
            assert hours.allocated == pytest.approx(sum(h.allocated for h in mine))
            assert hours.used == pytest.approx(sum(h.used for h in mine))
            assert hours.unmeasured == pytest.approx(sum(h.unmeasured for h in mine))
    assert report.total.used == pytest.approx(sum(h.used for h in report.teams.values()))


@settings(max_examples=150, deadline=None)
@given(jobs_st, records_st, st.randoms(use_true_random=False))
def test_duplicated_and_reordered_records_give_the_same_report(jobs, records, rnd):
    once = _ledger(jobs, records).report(now=6000)

    def twice_shuffled(built):
        doubled = built + built
        rnd.shuffle(doubled)
        return doubled
    again = _ledger(jobs, records, order=twice_shuffled).report(now=6000)
    assert again.jobs.keys() == once.jobs.keys()
    assert again.unattributed == once.unattributed
    for job_id, job in once.jobs.items():
        other = again.jobs[job_id]
        assert other.hours.used == pytest.approx(job.hours.used)
        assert other.hours.unmeasured == pytest.approx(job.hours.unmeasured)
        assert other.hours.allocated == job.hours.allocated
        assert (other.idle_s, other.idle, other.idle_now) == (pytest.approx(job.idle_s), job.idle, job.idle_now)


@settings(max_examples=100, deadline=None)
@given(st.floats(0, 100), st.integers(1, 4), st.sampled_from([7, 30, 60]))
def test_full_coverage_at_a_constant_level_uses_that_fraction(sm, workers, step):
    ledger = UtilizationLedger()
    ledger.hold("a", 0, "t1", "p1", workers, 1000, time=0)
    for w in range(workers):
        for u in every("a", w, 0, 420, step, sm):
            ledger.add(u)
    hours = ledger.report(now=420).jobs["a"].hours
    assert hours.used == pytest.approx(hours.allocated * sm / 100)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.floats(1, 3000), st.floats(0.1, 1500)), min_size=1, max_size=30),
       st.floats(0, 1000), st.floats(0, 3000))
def test_a_fully_busy_worker_uses_exactly_the_allocated_time_its_windows_cover(windows, start, length):
    ledger = UtilizationLedger()
    ledger.hold("a", 0, "t1", "p1", 1, 1000, time=start)
    ledger.release("a", 0, start + length)
    for t, w in windows:
        ledger.add(usage("a", 0, t, w, 100.0))
    spans = sorted((max(t - w, start), min(t, start + length)) for t, w in windows)
    union, reach = 0.0, start
    for a, b in spans:   # brute-force measure of the union of the clipped windows
        if b > max(a, reach):
            union += b - max(a, reach)
            reach = b
    assert ledger.report(now=9999).jobs["a"].hours.used * 3600 == pytest.approx(union, abs=1e-6)


def test_the_report_prints_per_team_and_pool_and_names_the_idle_jobs():
    from gpusched.consumers.usage_report import format_report, report_json

    ledger = UtilizationLedger(idle_after_s=60)
    ledger.hold("nb-1", 0, "t-idle", "p1", 1, 1000, time=0)
    ledger.hold("tr-1", 0, "t-busy", "p1", 1, 1000, time=0)
    for u in every("nb-1", 0, 0, 600, 30, 0.0, simulated=True) + every("tr-1", 0, 0, 600, 30, 90.0, simulated=True):
        ledger.add(u)
    report = ledger.report(now=600)
    text = format_report(report, ledger)
    assert "GPU-seconds allocated vs used" in text
    assert "team t-busy" in text and "90.0%" in text and "pool p1" in text
    assert "nb-1" in text and "still idle" in text and "[simulated]" in text
    assert "job tr-1" not in text and "job tr-1" in format_report(report, ledger, per_job=True)
    printed = report_json(report)
    assert printed["idle_jobs"] == ["nb-1"]
    assert printed["teams"]["t-busy"]["utilization"] == pytest.approx(0.9)


def test_an_attempt_holding_again_keeps_its_earlier_time():
    ledger = UtilizationLedger()
    ledger.hold("a", 0, "t1", "p1", 1, 1000, time=0)
    ledger.release("a", 0, 1800)
    ledger.hold("a", 0, "t1", "p1", 1, 1000, time=3000)
    ledger.release("a", 0, 3600)
    assert ledger.report(now=9999).jobs["a"].hours.allocated == pytest.approx(1.0)
