"""OpenTelemetry tracing: one tracer provider per process, one trace per job across services.

Admission's ``SubmitJob`` span starts a job's trace; its W3C context travels inside the
event envelope (``trace_context``). Every service folding the log continues it: a
``process <topic>`` consumer span per event about a traced job (messaging semantic
conventions), parented by the context in the envelope. The first context seen for a job
(its ``JobSubmitted``) is kept in ``JOBS``: the placer's decision span, the preemptor's
decision spans, the node-agent's worker spans and any event published about the job
outside a span join that trace.

A caller's own trace continues into the API: ``server_span`` reads the ``traceparent``
gRPC metadata (the Python client sends it while a span is current). A batch
(``SubmitJobs``) gives each job a trace of its own, linked to the batch's span
(``batch_item_spans``), as OpenTelemetry's messaging conventions do for batches. A
decision made outside any span (the preemptor's) names the context its event is
published with through ``publish_in``.

Exporter: OTLP when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set, the console when
``GPUSCHED_TRACE_CONSOLE=1``, otherwise tracing stays off: nothing is recorded, the fold
pays one ``is None`` test per record, and the API's no-op tracer costs nothing per
request. docs/reference/observability.md lists the span names and attributes.
"""
from __future__ import annotations

from collections import OrderedDict
from contextlib import contextmanager
from typing import Iterator

from opentelemetry import context, propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode

from gpusched.config import process_settings

TRACER_NAME = "gpusched"
# Contexts of this many jobs are kept (the oldest is forgotten first): a job's trace
# context is 2 short strings, so this bounds the registry at a few MB.
MAX_TRACED_JOBS = 100_000


class JobContexts:
    """job id -> the carrier (``traceparent``...) of the span that started the job's trace."""

    def __init__(self, limit: int = MAX_TRACED_JOBS) -> None:
        self._carriers: OrderedDict[str, dict[str, str]] = OrderedDict()
        self._limit = limit

    def note(self, job_id: str, carrier) -> None:
        if job_id in self._carriers or "traceparent" not in carrier:
            return
        self._carriers[job_id] = dict(carrier)
        if len(self._carriers) > self._limit:
            self._carriers.popitem(last=False)

    def carrier(self, job_id: str) -> dict[str, str] | None:
        return self._carriers.get(job_id)

    def context(self, job_id: str) -> context.Context | None:
        carrier = self._carriers.get(job_id)
        return None if carrier is None else propagate.extract(carrier)

    def clear(self) -> None:
        self._carriers.clear()


JOBS = JobContexts()
# Events whose envelope must carry a given span's context (a decision span that is not
# current when the event is published), by event id; taken once, when it is published.
# Bounded: an event decided but never published (its round failed) is forgotten in time.
MAX_PENDING_EVENTS = 10_000
_EVENT_CARRIERS: OrderedDict[str, dict[str, str]] = OrderedDict()
_provider: TracerProvider | None = None   # set when this process records spans
_tracer: trace.Tracer | None = None
_consumer = ""                        # this service, as the messaging consumer group


def setup_tracing(service: str, exporter: SpanExporter | None = None, always: bool = False) -> trace.Tracer:
    """Install an SDK tracer provider when there is somewhere to send spans (or
    ``always``, for tests that attach their own processor)."""
    global _provider, _tracer, _consumer
    exporter = exporter or _exporter_from_env()
    if exporter is not None or always:
        provider = TracerProvider(resource=Resource.create({"service.name": service}))
        if exporter is not None:
            provider.add_span_processor(BatchSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        _provider, _tracer, _consumer = provider, provider.get_tracer(TRACER_NAME), service
        return provider.get_tracer(service)
    return trace.get_tracer(service)


def _exporter_from_env() -> SpanExporter | None:
    settings = process_settings()
    if settings.otlp_endpoint:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        return OTLPSpanExporter(endpoint=settings.otlp_endpoint)
    if settings.trace_console:
        return ConsoleSpanExporter()
    return None


def current_context() -> dict[str, str]:
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier


def context_from(carrier: dict[str, str]) -> context.Context:
    return propagate.extract(dict(carrier))


def event_context(event) -> dict[str, str]:
    """The trace context an event is published with: the one ``publish_in`` named for it,
    else the current span's, else (an event about a job, written outside any span) the
    job's trace."""
    if _EVENT_CARRIERS:
        named = _EVENT_CARRIERS.pop(event.event_id, None)
        if named is not None:
            return named
    carrier = current_context()
    if carrier or _tracer is None:
        return carrier
    job_id = getattr(event, "job_id", None)
    return (JOBS.carrier(job_id) or {}) if job_id else {}


def consume_hook(live: bool = True):
    """What the fold calls for each record it applied, or None when tracing is off. A
    replay (``live`` false: a partition catching up) only learns the jobs' contexts: a
    span per record of history would cost ~25 µs each and flood the back-end."""
    if _tracer is None:
        return None
    return _consumed if live else _noted


def _noted(record, event, envelope, accepted: bool) -> None:
    job_id = getattr(event, "job_id", None)
    if job_id:
        JOBS.note(job_id, envelope.trace_context)


_last_consumed: tuple[str, dict[str, str]] = ("", {})


def consumed_carrier(event) -> dict[str, str] | None:
    """The trace context ``event``'s envelope carried, when it is the event this process's
    live fold consumed last (the fold calls its service's handler right after): the work
    view's writer passes it on, so the agent's consumer span has the same parent."""
    event_id, carrier = _last_consumed
    return dict(carrier) if event_id == event.event_id else None


def _consumed(record, event, envelope, accepted: bool) -> None:
    """A consumer span for an event about a traced job, parented by the envelope's context."""
    job_id = getattr(event, "job_id", None)
    carrier = envelope.trace_context
    if not job_id or "traceparent" not in carrier:
        return
    JOBS.note(job_id, carrier)
    global _last_consumed
    _last_consumed = (event.event_id, carrier)
    span = _tracer.start_span(
        f"process {record.topic}", context=propagate.extract(dict(carrier)), kind=SpanKind.CONSUMER,
        attributes={"messaging.system": "kafka", "messaging.operation.type": "process",
                    "messaging.operation.name": "process", "messaging.destination.name": record.topic,
                    "messaging.destination.partition.id": str(record.partition),
                    "messaging.kafka.offset": record.offset, "messaging.consumer.group.name": _consumer,
                    "messaging.message.id": event.event_id, "messaging.kafka.message.key": envelope.pool,
                    "gpusched.event": type(event).__name__, "gpusched.job_id": job_id,
                    "gpusched.accepted": accepted})
    span.end()


def view_consumed(record, doc: dict) -> None:
    """A consumer span for a work-view record about a traced job (a node-agent on its view,
    ``gpusched.adapters.nodes.work_view``), parented by the trace context the record carries:
    the span that published the pool-log event it reflects, as the writer folded it live
    (else the job's trace)."""
    carrier = doc.get("event_trace") or doc.get("trace") or {}
    if _tracer is None or "traceparent" not in carrier:
        return
    span = _tracer.start_span(
        f"process {record.topic}", context=propagate.extract(dict(carrier)), kind=SpanKind.CONSUMER,
        attributes={"messaging.system": "kafka", "messaging.operation.type": "process",
                    "messaging.operation.name": "process", "messaging.destination.name": record.topic,
                    "messaging.destination.partition.id": str(record.partition),
                    "messaging.kafka.offset": record.offset, "messaging.kafka.message.key": doc.get("job", ""),
                    "gpusched.event": doc.get("event", ""), "gpusched.job_id": doc.get("job", ""),
                    "gpusched.view.source_offset": doc["offset"]})
    span.end()


@contextmanager
def job_span(name: str, job_id: str, attributes: dict | None = None, link=None) -> Iterator[None]:
    """A span in the job's trace (its parent: the span that started the trace), current
    while the block runs, so what the block publishes carries it; ``link``: a span of
    another trace it belongs to as well (the scheduling cycle that decided many jobs)."""
    parent = JOBS.context(job_id) if _tracer is not None else None
    if parent is None:
        yield
        return
    linked = link.get_span_context() if link is not None else None
    with _tracer.start_as_current_span(name, context=parent, attributes={"gpusched.job_id": job_id,
                                                                         **(attributes or {})},
                                       links=[Link(linked)] if linked and linked.is_valid else None):
        yield


def publish_in(event, span: Span) -> None:
    """Publish ``event`` with ``span``'s context in its envelope, though the span is not
    current then (a decision span, ended before the proposer publishes its events)."""
    span_context = span.get_span_context()
    if _tracer is None or not span_context.is_valid:
        return
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=trace.set_span_in_context(span))
    _EVENT_CARRIERS[event.event_id] = carrier
    if len(_EVENT_CARRIERS) > MAX_PENDING_EVENTS:
        _EVENT_CARRIERS.popitem(last=False)


def decision_span(name: str, job_id: str, attributes: dict, start_time: int | None = None,
                  event=None, link_job: str = "") -> None:
    """A decision about a job made outside any span (the preemptor's round), as an ended
    span in the job's trace from ``start_time`` (ns) on; ``event``: the event that carries
    the decision, published with this span's context; ``link_job``: another job the
    decision was for (the preemptor's beneficiary), linked."""
    parent = JOBS.context(job_id) if _tracer is not None else None
    if parent is None:
        return
    linked = JOBS.context(link_job) if link_job else None
    links = [Link(trace.get_current_span(linked).get_span_context())] if linked is not None else None
    span = _tracer.start_span(name, context=parent, start_time=start_time, links=links,
                              attributes={"gpusched.job_id": job_id, **attributes})
    if event is not None:
        publish_in(event, span)
    span.end()


def rpc_parent(grpc_context) -> context.Context:
    """The caller's trace context from the W3C ``traceparent``/``tracestate`` gRPC metadata
    of a call (an empty context, so a new trace, when it sent none)."""
    fields = propagate.get_global_textmap().fields
    carrier = {key: value for key, value in (grpc_context.invocation_metadata() or ()) if key in fields}
    return propagate.extract(carrier) if carrier else context.Context()


@contextmanager
def server_span(method: str, grpc_context, service: str) -> Iterator[Span]:
    """The span of one API call, a child of the caller's span when it sent its context
    (RPC semantic conventions: ``rpc.system``, ``rpc.service``, ``rpc.method``)."""
    if _tracer is None:   # tracing off: nothing to read or record on the API's hot path
        yield trace.INVALID_SPAN
        return
    with _tracer.start_as_current_span(
            method, context=rpc_parent(grpc_context), kind=SpanKind.SERVER,
            attributes={"rpc.system": "grpc", "rpc.service": service, "rpc.method": method}) as span:
        yield span


@contextmanager
def batch_item_spans(name: str, items: list[tuple[str, object]]) -> Iterator[None]:
    """One root span (a trace of its own) per (job id, event) of a batch, linked to the
    current span (the batch's), each event published with its job's span: one trace per
    job, as for a job submitted alone. The spans end when the block does."""
    if _tracer is None:
        yield
        return
    batch = trace.get_current_span().get_span_context()
    links = [Link(batch)] if batch.is_valid else None
    spans = []
    for job_id, event in items:
        span = _tracer.start_span(name, context=context.Context(), links=links, kind=SpanKind.SERVER,
                                  attributes={"gpusched.job_id": job_id, "gpusched.batch_size": len(items)})
        publish_in(event, span)
        spans.append(span)
    try:
        yield
    except BaseException as exc:
        for span in spans:
            span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
        raise
    finally:
        for span in spans:
            span.end()


def mark(name: str, job_id: str, **attributes) -> None:
    """An instant span in the job's trace (a worker started, a worker ended)."""
    with job_span(name, job_id, attributes):
        pass


def provider() -> TracerProvider | None:
    """The provider ``setup_tracing`` installed (tests attach an in-memory exporter to it)."""
    return _provider


def tracer() -> trace.Tracer:
    """This process's tracer (the no-op one while tracing is off)."""
    return _tracer or trace.get_tracer(TRACER_NAME)
