"""The audit and billing consumers' pure side: which event means which row, the spans'
GPU-hours per day, and the store's idempotent writes (a real SQLite file)."""
from __future__ import annotations

from datetime import datetime, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.consumers import reports
from gpusched.consumers.billing import BillingLedger
from gpusched.consumers.records import (AuditRow, SpanEnd, SpanStart, SpanTracker, allocated_hours, audit_row,
                                        split_by_day)
from gpusched.consumers.store import Store, audit, span_end, span_start
from gpusched.core import events as ev
from gpusched.core.model import GpuSlot, JobSpec, WorkerAssignment, WorkerResources
from gpusched.core.reducer import apply
from gpusched.core.state import ClusterState
from tests.unit.core.builders import make_node

MIDNIGHT = datetime(2026, 3, 2, tzinfo=timezone.utc).timestamp()


def _job(job_id, team, gpus, t0, start, end, nodes=("n1",)):
    spec = JobSpec(job_id, team, workers=len(nodes), resources=WorkerResources(gpus=gpus))
    workers = tuple(WorkerAssignment(i, n, tuple(GpuSlot(g) for g in range(gpus))) for i, n in enumerate(nodes))
    out = [ev.JobSubmitted(event_id=f"{job_id}s", time=t0, job_id=job_id, spec=spec, principal="alice"),
           ev.JobPlaced(event_id=f"{job_id}p", time=t0, job_id=job_id, attempt=0, workers=workers)]
    out += [ev.WorkerStarted(event_id=f"{job_id}w{i}", time=start, job_id=job_id, attempt=0, worker=i, node=n)
            for i, n in enumerate(nodes)]
    out += [ev.WorkerFinished(event_id=f"{job_id}f{i}", time=end, job_id=job_id, attempt=0, worker=i, node=n,
                              exit_code=0) for i, n in enumerate(nodes)]
    return out


NODES = [ev.NodeRegistered(event_id=f"reg-{n}", node=make_node(n, 8)) for n in ("n1", "n2")]


def _fold(events):
    """(rows, reference ledger) of events folded in order, as the consumer does."""
    state, tracker, ledger, rows = ClusterState(), SpanTracker(), BillingLedger(), []
    for e in events:
        outcome = apply(state, e)
        rows += tracker.observe(e, outcome, state)
        if audit_row(e, outcome, state, "default") is not None:
            rows.append(audit_row(e, outcome, state, "default"))
        if outcome.accepted:
            for job_id in outcome.jobs:
                ledger.observe(state.jobs[job_id], e.time)
    return rows, ledger


def _spans(rows):
    from gpusched.consumers.records import Span
    ends = {r.span_id: r.end for r in rows if isinstance(r, SpanEnd)}
    return [Span(r.job_id, r.team, r.pool, r.milli, r.start, ends.get(r.span_id)) for r in rows
            if isinstance(r, SpanStart)]


def test_a_job_is_one_span_from_its_last_worker_start_to_its_release():
    rows, _ = _fold([*NODES, *_job("g", "t1", 2, 0.0, 10.0, 3610.0, nodes=("n1", "n2"))])
    starts = [r for r in rows if isinstance(r, SpanStart)]
    ends = [r for r in rows if isinstance(r, SpanEnd)]
    assert [(s.span_id, s.job_id, s.team, s.milli, s.start) for s in starts] == [("gw1/g", "g", "t1", 4000, 10.0)]
    assert [(e.span_id, e.event_id, e.end) for e in ends] == [("gw1/g", "gf1", 3610.0)]   # the last worker gone
    assert allocated_hours(_spans(rows), ("team",)) == {("t1",): pytest.approx(4.0)}


def test_a_redelivered_event_yields_no_row():
    events = [*NODES, *_job("a", "t1", 1, 0.0, 5.0, 50.0)]
    rows, _ = _fold(events + events)   # the reducer drops ids it applied: no second span, no audit row
    assert sum(isinstance(r, SpanStart) for r in rows) == 1
    assert sum(isinstance(r, AuditRow) and r.action == "JobSubmitted" for r in rows) == 1


jobs = st.lists(st.tuples(st.sampled_from(["t1", "t2", "t3"]), st.integers(1, 4),
                          st.floats(0, 2 * 86400), st.floats(1, 2 * 86400)), min_size=1, max_size=6)


@settings(max_examples=60, deadline=None)
@given(jobs)
def test_span_hours_per_team_and_day_equal_the_billing_fold(specs):
    events = list(NODES)
    for i, (team, gpus, start, length) in enumerate(specs):
        events += _job(f"j{i}", team, gpus, MIDNIGHT + start - 1, MIDNIGHT + start, MIDNIGHT + start + length,
                       nodes=(("n1", "n2")[i % 2],))
    # jobs on one node may collide on GPU 0: the reducer refuses that placement, and neither fold charges it
    rows, ledger = _fold(events)
    spans = _spans(rows)
    assert all(s.end is not None for s in spans)
    per_team = {k[0]: v for k, v in allocated_hours(spans, ("team",)).items()}
    assert per_team == pytest.approx(ledger.gpu_hours(), rel=1e-9)
    per_day = allocated_hours(spans, ("team", "day"))
    assert sum(per_day.values()) == pytest.approx(sum(ledger.gpu_hours().values()), rel=1e-9)


def test_days_split_at_utc_midnight_and_ranges_clip():
    assert split_by_day(MIDNIGHT - 3600, MIDNIGHT + 7200) == [("2026-03-01", 3600.0), ("2026-03-02", 7200.0)]
    assert split_by_day(MIDNIGHT, MIDNIGHT) == []
    rows, _ = _fold([*NODES, *_job("a", "t1", 1, MIDNIGHT - 7200, MIDNIGHT - 3600, MIDNIGHT + 3600)])
    spans = _spans(rows)
    assert allocated_hours(spans, ("day",)) == {("2026-03-01",): pytest.approx(1.0), ("2026-03-02",): pytest.approx(1.0)}
    assert allocated_hours(spans, ("team",), since=MIDNIGHT) == {("t1",): pytest.approx(1.0)}
    with pytest.raises(ValueError, match="group by"):
        allocated_hours(spans, ("colour",))


def test_audit_names_the_principal_and_whether_a_proposal_was_applied():
    state = ClusterState()
    for e in NODES:
        apply(state, e)
    submit = _job("a", "t1", 1, 1.0, 2.0, 3.0)[0]
    row = audit_row(submit, apply(state, submit), state, "default")
    assert (row.action, row.principal, row.subject, row.team, row.accepted) == ("JobSubmitted", "alice", "a", "t1", True)
    placed = _job("a", "t1", 1, 1.0, 2.0, 3.0)[1]
    assert audit_row(placed, apply(state, placed), state, "default") is None   # not someone's act
    stale = ev.JobPreempted(event_id="p1", time=4.0, producer="preemptor-0", job_id="a", attempt=7, reason="quota")
    row = audit_row(stale, apply(state, stale), state, "default")
    assert (row.action, row.principal, row.producer, row.accepted) == ("JobPreempted", "", "preemptor-0", False)


def test_the_store_writes_each_row_once(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'a.db'}")
    rows, _ = _fold([*NODES, *_job("a", "t1", 1, 0.0, 5.0, 50.0)])
    for _ in range(2):   # a redelivery
        store.write("c.", rows, "billing", "c.cluster-events", 0, 9)
    assert [store.count(t, "c.") for t in (span_start, span_end, audit)] == [1, 1, 3]
    assert store.progress("c.", "billing") == {("c.cluster-events", 0): (9, 2)}
    assert allocated_hours(store.spans("c."), ("team",)) == {("t1",): pytest.approx(45 / 3600)}
    assert store.spans("c.", team="t2") == [] and store.spans("c.", since=60.0) == []


def test_the_reports_say_what_is_wrong(tmp_path, capsys):
    missing = f"sqlite:///{tmp_path / 'none.db'}"
    assert reports.billing_main(["--db", missing]) == 1
    assert "does not exist" in capsys.readouterr().err
    url = f"sqlite:///{tmp_path / 'a.db'}"
    Store(url).write("c.", [], "billing", "c.cluster-events", 0, 0)
    assert reports.billing_main(["--db", url, "--topic-prefix", "wrong."]) == 1
    assert "holds nothing for topic prefix 'wrong.' (it holds: 'c.')" in capsys.readouterr().err
    assert reports.audit_main(["--db", url, "--topic-prefix", "c."]) == 1
    assert "no audit consumer ran for 'c.'" in capsys.readouterr().err
    assert reports.billing_main(["--db", url, "--topic-prefix", "c."]) == 0
    assert "no GPU time in this range" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exited:
        reports.billing_main(["--db", url, "--follow", "-1"])
    assert exited.value.code == 2 and "--follow" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        reports.billing_main(["--db", url, "--since", "yesterday"])
    assert "neither epoch seconds nor an ISO date" in capsys.readouterr().err
    assert reports.parse_time("2026-03-02") == MIDNIGHT


def test_audit_records_who_set_a_pools_topology_levels():
    state = ClusterState()
    for levels, accepted, detail in ((("spine", "rack", "block"), True, "levels=spine,rack,block"),
                                     (("bad level",), False, "levels=bad level"), ((), True, "levels=(default)")):
        e = ev.PoolTopologySet(event_id=f"t{len(levels)}{accepted}", time=1.0, producer="admission-0", pool="gpu-a",
                               levels=levels, principal="ops")
        row = audit_row(e, apply(state, e), state, "gpu-a")
        assert (row.action, row.principal, row.subject, row.accepted, row.detail) == \
            ("PoolTopologySet", "ops", "gpu-a", accepted, detail)
