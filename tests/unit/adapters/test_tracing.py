"""One trace per job: the context in the event envelope is continued by every consumer.

Spans go to an in-memory exporter here; tests/integration/test_observability.py checks
the same trace in a real Jaeger, across service processes."""
from __future__ import annotations

from typing import NamedTuple

import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry import trace
from opentelemetry.trace import SpanKind

from gpusched.adapters.log import codec

from gpusched.adapters.telemetry import tracing
from gpusched.adapters.log.fold import fold_records
from gpusched.adapters.log.publisher import DeadLetters
from gpusched.core import events as ev
from gpusched.core.state import ClusterState


class Record(NamedTuple):
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes


@pytest.fixture(scope="module")
def tracer():
    return tracing.setup_tracing("test-service", always=True)


@pytest.fixture
def spans(tracer):
    exporter = InMemorySpanExporter()
    processor = SimpleSpanProcessor(exporter)
    tracing.provider().add_span_processor(processor)
    tracing.JOBS.clear()
    yield exporter
    processor.shutdown()


def cancelled(job_id: str, event_id: str) -> ev.Event:
    return ev.JobCancelled(event_id=event_id, job_id=job_id)


async def fold(*values: bytes) -> None:
    records = [Record("t.events", 3, i, b"default", v) for i, v in enumerate(values)]
    await fold_records("test", ClusterState(), records, None, DeadLetters(None, "test"))


async def test_folding_an_event_about_a_traced_job_makes_a_consumer_span_in_its_trace(tracer, spans):
    with tracer.start_as_current_span("SubmitJob") as submit:
        data = codec.encode(cancelled("j1", "e1"), "default", tracing.event_context(cancelled("j1", "e1")))
    await fold(data)
    consumed = next(s for s in spans.get_finished_spans() if s.name == "process t.events")
    assert consumed.kind is SpanKind.CONSUMER
    assert consumed.context.trace_id == submit.get_span_context().trace_id
    assert consumed.parent.span_id == submit.get_span_context().span_id
    assert consumed.attributes["messaging.system"] == "kafka"
    assert consumed.attributes["messaging.destination.name"] == "t.events"
    assert consumed.attributes["messaging.destination.partition.id"] == "3"
    assert consumed.attributes["messaging.kafka.offset"] == 0
    assert consumed.attributes["gpusched.job_id"] == "j1"
    assert consumed.attributes["gpusched.event"] == "JobCancelled"
    assert consumed.attributes["gpusched.accepted"] is False   # no such job in this state


async def test_events_published_outside_a_span_and_spans_of_the_job_join_its_trace(tracer, spans):
    with tracer.start_as_current_span("SubmitJob") as submit:
        first = codec.encode(cancelled("j2", "e1"), "default", tracing.event_context(cancelled("j2", "e1")))
    await fold(first)   # the job's context is now known to this process
    later = tracing.event_context(cancelled("j2", "e2"))   # no span is current here
    with tracing.job_span("place", "j2", {"gpusched.pool": "default"}):
        pass
    tracing.mark("worker end", "j2")
    root = submit.get_span_context()
    assert later["traceparent"].split("-")[1] == f"{root.trace_id:032x}"
    by_name = {s.name: s for s in spans.get_finished_spans()}
    for name in ("place", "worker end"):
        assert by_name[name].context.trace_id == root.trace_id
        assert by_name[name].parent.span_id == root.span_id
        assert by_name[name].attributes["gpusched.job_id"] == "j2"


async def test_a_job_span_links_the_batched_cycle_that_decided_it(tracer, spans):
    with tracer.start_as_current_span("SubmitJob"):
        data = codec.encode(cancelled("j3", "e1"), "default", tracing.event_context(cancelled("j3", "e1")))
    await fold(data)
    with tracer.start_as_current_span("schedule-cycle") as cycle:
        pass
    with tracing.job_span("place", "j3", link=cycle):
        pass
    place = next(s for s in spans.get_finished_spans() if s.name == "place")
    assert [link.context.span_id for link in place.links] == [cycle.get_span_context().span_id]
    assert place.context.trace_id != cycle.get_span_context().trace_id


async def test_untraced_events_make_no_spans_and_no_context(tracer, spans):
    assert tracing.event_context(cancelled("j4", "e1")) == {}
    await fold(codec.encode(cancelled("j4", "e1"), "default", {}))
    with tracing.job_span("place", "j4"):
        pass
    assert spans.get_finished_spans() == ()


async def test_a_replay_makes_no_spans_but_later_spans_of_the_job_join_its_trace(tracer, spans):
    with tracer.start_as_current_span("SubmitJob") as submit:
        data = codec.encode(cancelled("j5", "e1"), "default", tracing.event_context(cancelled("j5", "e1")))
    spans.clear()
    await fold_records("test", ClusterState(), [Record("t.events", 0, 0, None, data)], None,
                       DeadLetters(None, "test"), live=False)
    assert spans.get_finished_spans() == ()
    tracing.mark("worker end", "j5")
    [end] = spans.get_finished_spans()
    assert end.parent.span_id == submit.get_span_context().span_id


# --- a batch, the caller's context, decisions made outside a span ------------------------
class Call:
    """What ``rpc_parent`` reads of a gRPC call: its metadata."""

    def __init__(self, metadata) -> None:
        self.metadata = metadata

    def invocation_metadata(self):
        return self.metadata


def submitted(job_id: str) -> ev.Event:
    return ev.JobCancelled(event_id=f"submit-{job_id}", job_id=job_id)


async def test_each_job_of_a_batch_starts_a_trace_of_its_own_linked_to_the_batch(tracer, spans):
    events = {job_id: submitted(job_id) for job_id in ("b1", "b2", "b3")}
    with tracer.start_as_current_span("SubmitJobs") as batch:
        with tracing.batch_item_spans("SubmitJob", list(events.items())):
            carriers = {job_id: tracing.event_context(event) for job_id, event in events.items()}
    roots = {s.attributes["gpusched.job_id"]: s for s in spans.get_finished_spans() if s.name == "SubmitJob"}
    assert set(roots) == set(events)
    trace_ids = {root.context.trace_id for root in roots.values()}
    assert len(trace_ids) == 3 and batch.get_span_context().trace_id not in trace_ids
    for job_id, root in roots.items():
        assert root.parent is None
        assert [link.context.span_id for link in root.links] == [batch.get_span_context().span_id]
        # each job's event is published in its own trace, not the batch's
        assert carriers[job_id]["traceparent"].split("-")[1:3] == [
            f"{root.context.trace_id:032x}", f"{root.context.span_id:016x}"]


async def test_the_callers_traceparent_metadata_parents_the_server_span(tracer, spans):
    with tracer.start_as_current_span("client") as client:
        sent = tuple(tracing.current_context().items())
    with tracing.server_span("SubmitJob", Call(sent + (("authorization", "x"),)), "gpusched.v1.AdmissionService"):
        pass
    with tracing.server_span("SubmitJob", Call(()), "gpusched.v1.AdmissionService"):
        pass
    with_caller, alone = [s for s in spans.get_finished_spans() if s.name == "SubmitJob"]
    assert with_caller.context.trace_id == client.get_span_context().trace_id
    assert with_caller.parent.span_id == client.get_span_context().span_id
    assert with_caller.kind is SpanKind.SERVER and with_caller.attributes["rpc.system"] == "grpc"
    assert alone.parent is None and alone.context.trace_id != client.get_span_context().trace_id


async def test_a_decision_span_joins_the_jobs_trace_and_its_event_carries_it(tracer, spans):
    with tracer.start_as_current_span("SubmitJob") as submit:
        await fold(codec.encode(cancelled("d1", "e1"), "default", tracing.event_context(cancelled("d1", "e1"))))
    with tracer.start_as_current_span("SubmitJob") as other:
        await fold(codec.encode(cancelled("d2", "e2"), "default", tracing.event_context(cancelled("d2", "e2"))))
    preempted = ev.JobPreempted(event_id="p1", job_id="d1", attempt=0, for_job="d2", reason="preemption: x")
    tracing.decision_span("preempt", "d1", {"gpusched.cause": "preemption"}, event=preempted, link_job="d2")
    [preempt] = [s for s in spans.get_finished_spans() if s.name == "preempt"]
    assert preempt.parent.span_id == submit.get_span_context().span_id
    assert [link.context.trace_id for link in preempt.links] == [other.get_span_context().trace_id]
    carrier = tracing.event_context(preempted)   # as the proposer publishes it, outside any span
    assert carrier["traceparent"].split("-")[2] == f"{preempt.context.span_id:016x}"
    # taken once: the event's id names no context any more
    assert tracing.event_context(preempted)["traceparent"].split("-")[2] == f"{submit.get_span_context().span_id:016x}"


async def test_the_preemptors_decisions_are_spans_in_the_traces_of_the_jobs_they_touch(tracer, spans):
    from gpusched_preemptor.spans import traced
    from tests.unit.core.builders import Log, make_node, whole

    log = Log(make_node("n1"))
    roots = {}
    for job_id in ("v1", "v2"):
        assert log.submit(job_id).accepted
        with tracer.start_as_current_span("SubmitJob") as roots[job_id]:
            await fold(codec.encode(cancelled(job_id, f"s-{job_id}"), "default",
                                    tracing.event_context(cancelled(job_id, f"s-{job_id}"))))
        log.run(job_id, ("n1", whole(0 if job_id == "v1" else 1)))
    preempted = ev.JobPreempted(event_id="p1", job_id="v1", attempt=0, for_job="v2", reason="defrag: moved")
    lost = ev.NodeLost(event_id="l1", node="n1", reason="no heartbeat")
    decide = traced(lambda partition, state, now: [(preempted, "default"), (lost, "default")])
    assert decide(0, log.state, 0.0) == [(preempted, "default"), (lost, "default")]
    done = spans.get_finished_spans()
    [preempt] = [s for s in done if s.name == "preempt"]
    assert preempt.parent.span_id == roots["v1"].get_span_context().span_id
    assert preempt.attributes["gpusched.cause"] == "defrag" and preempt.attributes["gpusched.for_job"] == "v2"
    assert tracing.event_context(preempted)["traceparent"].split("-")[2] == f"{preempt.context.span_id:016x}"
    node_lost = {s.attributes["gpusched.job_id"]: s for s in done if s.name == "node lost"}
    assert {job: s.context.trace_id for job, s in node_lost.items()} == {
        job: root.get_span_context().trace_id for job, root in roots.items()}


async def test_a_work_view_record_makes_the_agents_consumer_span_a_child_of_the_events_publisher(tracer, spans):
    """The writer folds a placement live: its record of the node carries the job's trace
    (for the worker spans) and the placement's publisher context, the parent of the span
    the agent makes on reading the record (``tracing.view_consumed``)."""
    from gpusched.adapters.nodes.work_view import ViewBuilder, decode_record
    from tests.unit.core.builders import make_node, make_spec, whole, workers

    node = ev.NodeRegistered(event_id="r", node=make_node("a"))
    with tracer.start_as_current_span("SubmitJob") as submit:
        submitted = ev.JobSubmitted(event_id="s", job_id="j", spec=make_spec())
        submitted_data = codec.encode(submitted, "default", tracing.event_context(submitted))
    with tracer.start_as_current_span("place", context=trace.set_span_in_context(submit)) as place:
        placed = ev.JobPlaced(event_id="p", job_id="j", attempt=0, workers=workers(("a", whole(0))))
        placed_data = codec.encode(placed, "default", tracing.event_context(placed))
    builder, out = ViewBuilder(tracing.JOBS.carrier, tracing.consumed_carrier), []
    state = ClusterState()
    state.pools["default"] = None
    records = [Record("t.events", 0, i, b"default", v)
               for i, v in enumerate([codec.encode(node, "default"), submitted_data, placed_data])]
    await fold_records("test", state, records, lambda *a: out.extend(builder.records(*a)), DeadLetters(None, "test"))
    [record] = [r for r in out if r.key == "job:j"]
    doc = decode_record(*record.encode()[1:])
    tracing.view_consumed(Record("t.work.a", 0, 7, b"job:j", b""), doc)
    [consumed] = [s for s in spans.get_finished_spans() if s.name == "process t.work.a"]
    assert consumed.kind is SpanKind.CONSUMER
    assert consumed.context.trace_id == submit.get_span_context().trace_id
    assert consumed.parent.span_id == place.get_span_context().span_id
    assert consumed.attributes["gpusched.event"] == "JobPlaced"
    assert consumed.attributes["gpusched.job_id"] == "j"
    assert consumed.attributes["gpusched.view.source_offset"] == 2
    assert doc["trace"]["traceparent"].split("-")[2] == f"{submit.get_span_context().span_id:016x}"
