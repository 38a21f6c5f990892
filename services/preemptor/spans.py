"""The preemptor's decisions as spans in the traces of the jobs they touch.

The decider (``decide.py``) stays free of tracing: ``traced`` wraps it, and after each
round makes one span per decision, parented by the affected job's trace (its context
is what the log's ``JobSubmitted`` carried, kept in ``tracing.JOBS``). A decision that
is an event about the job (a preemption, a time-out, a hung attempt) is published with
its span's context, so every service's consumer span of that event is its child. Spans
start when the round began: their length is the round's. docs/reference/observability.md lists them.
"""
from __future__ import annotations

import time

from gpusched.adapters.telemetry import tracing
from gpusched.core import events as ev
from gpusched.core.state import ClusterState


def traced(decide):
    """``decide`` (partition, state, now) -> events, recording a span per decision."""
    def decide_and_trace(partition: int, state: ClusterState, now: float) -> list[tuple[ev.Event, str]]:
        started = time.time_ns()
        decisions = decide(partition, state, now)
        if decisions and tracing.provider() is not None:
            for event, _pool in decisions:
                record(event, state, started)
        return decisions
    return decide_and_trace


def record(event: ev.Event, state: ClusterState, started: int) -> None:
    """The span(s) of one decision."""
    kind = type(event)
    if kind is ev.JobPreempted:
        # "preemption: preempted for job-x", "defrag: ..." (policies.preemption.decisions)
        cause = event.reason.split(":", 1)[0]
        tracing.decision_span("preempt", event.job_id, {
            "gpusched.attempt": event.attempt, "gpusched.for_job": event.for_job, "gpusched.cause": cause,
            "gpusched.reason": event.reason}, started, event, link_job=event.for_job)
    elif kind is ev.AttemptTimedOut:
        tracing.decision_span("time out", event.job_id, {"gpusched.attempt": event.attempt,
                                                         "gpusched.reason": event.reason}, started, event)
    elif kind is ev.AttemptFailed:   # the preemptor fails an attempt only when it hangs
        tracing.decision_span("declare hung", event.job_id, {"gpusched.attempt": event.attempt,
                                                             "gpusched.reason": event.reason}, started, event)
    elif kind in (ev.NodeLost, ev.NodeFenced):
        # One event about a node: a span in the trace of each job it held.
        name = "node lost" if kind is ev.NodeLost else "node fenced"
        node = state.nodes.get(event.node)
        for job_id in sorted(node.jobs) if node is not None else ():
            tracing.decision_span(name, job_id, {"gpusched.node": event.node,
                                                 "gpusched.reason": getattr(event, "reason", "")}, started)
