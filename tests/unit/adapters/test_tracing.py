"""One trace per job: the context in the event envelope is continued by every consumer.

Spans go to an in-memory exporter here; tests/integration/test_observability.py checks
the same trace in a real Jaeger, across service processes."""
from __future__ import annotations

from typing import NamedTuple

import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from gpusched.adapters import codec, tracing
from gpusched.adapters.fold import fold_records
from gpusched.adapters.publisher import DeadLetters
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
