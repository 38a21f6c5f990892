"""What the audit and billing consumers store: rows computed from the log. Pure.

Each row is keyed by the id of the record it comes from (an event id, a usage record id),
so writing it again is a no-op: at-least-once delivery and restarts never double-count
(the store upserts with "insert, do nothing on conflict", ``gpusched.consumers.store``).

* Audit: one row per event that says who did what (submissions, cancellations, policy,
  node changes, preemptions, supervisors' verdicts), with the principal the API
  recorded (``""`` when a service decided it: then ``producer`` names the instance).
* Billing: an allocation *span* per job attempt that held GPUs, as two rows: its start
  (the event after which the job is charged, ``CHARGED``) and its end (the event after
  which it is not). A job's GPU-hours are computed from (start, end) pairs and
  attributed to the UTC days they cover. Charging follows the log's billing fold,
  ``gpusched.consumers.billing.BillingLedger``: what ran, not what was proposed.
* Usage: one row per usage record (``<prefix>usage``): the milli-seconds of GPU its
  measured GPUs were busy (milli x SM fraction x window).
"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Iterable

from gpusched.adapters.nodes.usage_records import WorkerUsage
from gpusched.consumers.billing import CHARGED
from gpusched.core import events as ev
from gpusched.core.reducer import Outcome
from gpusched.core.state import ClusterState

MS_PER_GPU_HOUR = 1000 * 3600   # milli x seconds in one GPU-hour
DAY_S = 86400.0


@dataclass(frozen=True, slots=True)
class AuditRow:
    event_id: str
    time: float
    pool: str
    action: str          # the event type, e.g. "JobCancelled"
    principal: str       # who asked through the API; "" when a service decided
    producer: str        # the service instance that wrote the event
    subject: str         # the job, node, team or pool acted on
    team: str
    accepted: bool       # whether the reducer applied it (proposals may be refused)
    detail: str


@dataclass(frozen=True, slots=True)
class SpanStart:
    span_id: str         # "<event id>/<job id>": the event that started the charge
    event_id: str
    job_id: str
    attempt: int
    team: str
    pool: str
    milli: int
    start: float


@dataclass(frozen=True, slots=True)
class SpanEnd:
    span_id: str
    event_id: str
    end: float


@dataclass(frozen=True, slots=True)
class UsageRow:
    record_id: str
    job_id: str
    attempt: int
    worker: int
    pool: str
    node: str
    time: float
    window_s: float
    used_milli_s: float       # sum over measured GPUs of milli x SM fraction x window
    measured_milli_s: float   # sum over measured GPUs of milli x window


Row = AuditRow | SpanStart | SpanEnd | UsageRow

AUDITED = (
    ev.JobSubmitted, ev.JobCancelled, ev.JobPreempted, ev.AttemptFailed, ev.AttemptTimedOut,
    ev.NodeRegistered, ev.NodeLost, ev.NodeFenced, ev.NodeCordoned, ev.NodeUncordoned, ev.GpuHealthChanged,
    ev.QuotaSet, ev.TeamPolicySet, ev.PoolCreated, ev.PoolTimeLimitsSet, ev.PoolTopologySet, ev.JobRetentionSet,
)


def audit_row(event: ev.Event, outcome: Outcome, state: ClusterState, pool: str) -> AuditRow | None:
    """The audit row of ``event`` (after the reducer applied it to ``state``), or None
    for events that are not someone's act (placements, worker reports, checkpoints)."""
    if not isinstance(event, AUDITED) or outcome.duplicate:
        return None
    subject, team, detail = _what(event, state)
    return AuditRow(event.event_id, event.time, pool, type(event).__name__, getattr(event, "principal", ""),
                    event.producer, subject, team, outcome.accepted, detail or outcome.reason)


def _what(event: ev.Event, state: ClusterState) -> tuple[str, str, str]:
    """(subject, team, detail) of an audited event."""
    match event:
        case ev.JobSubmitted(job_id=job_id, spec=spec):
            return job_id, spec.team, f"{spec.name} pool={spec.pool} workers={spec.workers} milli={spec.total_milli}"
        case ev.JobPreempted(job_id=job_id, for_job=for_job, reason=reason):
            return job_id, _team(state, job_id), f"for {for_job}: {reason}" if for_job else reason
        case ev.JobCancelled(job_id=job_id) | ev.AttemptFailed(job_id=job_id) | ev.AttemptTimedOut(job_id=job_id):
            return job_id, _team(state, job_id), event.reason
        case ev.NodeRegistered(node=node):
            return node.name, "", f"pool={node.pool} gpus={len(node.gpus)}"
        case ev.GpuHealthChanged(node=node, gpu_index=index, healthy=healthy, reason=reason):
            return node, "", f"gpu {index} {'healthy' if healthy else 'unhealthy'} {reason}".rstrip()
        case ev.NodeLost() | ev.NodeFenced() | ev.NodeCordoned() | ev.NodeUncordoned():
            return event.node, "", getattr(event, "reason", "")
        case ev.QuotaSet(quota=quota):
            return quota.team, quota.team, (f"org={quota.org} guaranteed_milli={quota.guaranteed_milli} "
                                            f"limit_milli={quota.limit_milli} borrowing={quota.borrowing}")
        case ev.TeamPolicySet(policy=policy):
            return policy.team, policy.team, (f"weight={policy.weight} priority_classes={list(policy.priority_classes)} "
                                              f"pools={list(policy.pools)}")
        case ev.PoolCreated(pool=pool):
            return pool, "", ""
        case ev.PoolTimeLimitsSet(pool=pool, default_s=default_s, max_s=max_s):
            return pool, "", f"default_s={default_s} max_s={max_s}"
        case ev.PoolTopologySet(pool=pool, levels=levels):
            return pool, "", f"levels={','.join(levels) or '(default)'}"
        case ev.JobRetentionSet(job_retention_s=seconds):
            return "", "", f"job_retention_s={seconds}"
    return "", "", ""


def _team(state: ClusterState, job_id: str) -> str:
    job = state.jobs.get(job_id)
    return job.team if job is not None else ""


class SpanTracker:
    """Which jobs hold a charge now, and the span rows an event opens or closes. Fed every
    event after the reducer applied it, in log order, from the start of the partition
    (a consumer restarted mid-log first folds the prefix it already stored)."""

    def __init__(self) -> None:
        self.open: dict[str, str] = {}   # job id -> span id

    def observe(self, event: ev.Event, outcome: Outcome, state: ClusterState) -> list[SpanStart | SpanEnd]:
        if not outcome.accepted:
            return []
        rows: list[SpanStart | SpanEnd] = []
        for job_id in outcome.jobs:
            job = state.jobs.get(job_id)
            charged = job is not None and job.phase in CHARGED
            span = self.open.get(job_id)
            if charged and span is None:
                span = self.open[job_id] = f"{event.event_id}/{job_id}"
                rows.append(SpanStart(span, event.event_id, job_id, job.attempt, job.team, job.spec.pool,
                                      job.milli, event.time))
            elif not charged and span is not None:
                del self.open[job_id]
                rows.append(SpanEnd(span, event.event_id, event.time))
        return rows


def usage_row(usage: WorkerUsage) -> UsageRow:
    measured = [g for g in usage.gpus if g.measured]
    used = sum(g.milli * g.sm_percent / 100 for g in measured) * usage.window_s
    return UsageRow(usage.record_id, usage.job_id, usage.attempt, usage.worker, usage.pool, usage.node,
                    usage.time, usage.window_s, used, sum(g.milli for g in measured) * usage.window_s)


# --- queries' arithmetic ------------------------------------------------------------------
def day_of(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d")


def split_by_day(start: float, end: float) -> list[tuple[str, float]]:
    """The seconds of [start, end) in each UTC day it covers, in order."""
    out: list[tuple[str, float]] = []
    t = start
    while t < end:
        day = datetime.fromtimestamp(t, timezone.utc).date()
        midnight = datetime(day.year, day.month, day.day, tzinfo=timezone.utc) + timedelta(days=1)
        stop = min(end, midnight.timestamp())
        out.append((day.isoformat(), stop - t))
        t = stop
    return out


@dataclass(frozen=True, slots=True)
class Span:
    """A start joined with its end (``end`` None: still charged)."""

    job_id: str
    team: str
    pool: str
    milli: int
    start: float
    end: float | None


GROUPS = ("team", "pool", "job", "day")


def allocated_hours(spans: Iterable[Span], by: tuple[str, ...], since: float = -math.inf,
                    until: float = math.inf, now: float | None = None) -> dict[tuple[str, ...], float]:
    """GPU-hours per group (``by``: names of ``GROUPS``), of the spans' time inside
    [since, until). An open span counts up to ``now``, or not at all without it."""
    unknown = set(by) - set(GROUPS)
    if unknown:
        raise ValueError(f"group by: {sorted(unknown)} not among {GROUPS}")
    totals: dict[tuple[str, ...], float] = defaultdict(float)
    for span in spans:
        end = span.end if span.end is not None else now
        if end is None:
            continue
        lo, hi = max(span.start, since), min(end, until)
        for day, seconds in split_by_day(lo, hi):
            fields = {"team": span.team, "pool": span.pool, "job": span.job_id, "day": day}
            totals[tuple(fields[k] for k in by)] += span.milli * seconds / MS_PER_GPU_HOUR
    return dict(sorted(totals.items()))
