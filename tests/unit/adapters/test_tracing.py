"""The W3C trace context rides in the event envelope, so spans join across services."""
from __future__ import annotations

from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from gpusched.adapters import codec
from gpusched.adapters.tracing import context_from, current_context, setup_tracing
from gpusched.core import events as ev


def test_a_span_started_from_a_decoded_envelope_joins_the_producers_trace():
    exporter = InMemorySpanExporter()
    tracer = setup_tracing("test", always=True)
    trace.get_tracer_provider().add_span_processor(SimpleSpanProcessor(exporter))
    with tracer.start_as_current_span("SubmitJob") as parent:
        data = codec.encode(ev.JobCancelled(event_id="e1", job_id="j"), "default", current_context())
    _, envelope = codec.decode(data)
    assert "traceparent" in envelope.trace_context
    with tracer.start_as_current_span("place", context=context_from(envelope.trace_context)) as child:
        pass
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert spans["place"].context.trace_id == parent.get_span_context().trace_id
    assert spans["place"].parent.span_id == parent.get_span_context().span_id
    assert child.get_span_context().trace_id == parent.get_span_context().trace_id


def test_without_an_active_span_no_context_is_written():
    data = codec.encode(ev.JobCancelled(event_id="e2", job_id="j"), "default", current_context())
    assert dict(codec.decode(data)[1].trace_context) == {}
