"""OpenTelemetry tracing: one tracer provider per process, one trace per job across services.

Admission's ``SubmitJob`` span starts a job's trace; its W3C context travels inside the
event envelope (``trace_context``). Every service folding the log continues it: a
``process <topic>`` consumer span per event about a traced job (messaging semantic
conventions), parented by the context in the envelope. The first context seen for a job
(its ``JobSubmitted``) is kept in ``JOBS``: the placer's decision span, the node-agent's
worker spans and any event published about the job outside a span join that trace.

Exporter: OTLP when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set, the console when
``GPUSCHED_TRACE_CONSOLE=1``, otherwise tracing stays off: nothing is recorded, the fold
pays one ``is None`` test per record, and the API's no-op tracer costs nothing per
request. docs/observability.md lists the span names and attributes.
"""
from __future__ import annotations

from collections import OrderedDict
from contextlib import contextmanager
from typing import Iterator

from opentelemetry import context, propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.trace import Link, SpanKind

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
    """The trace context an event is published with: the current span's, else (an event
    about a job, written outside any span) the job's trace."""
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


def _consumed(record, event, envelope, accepted: bool) -> None:
    """A consumer span for an event about a traced job, parented by the envelope's context."""
    job_id = getattr(event, "job_id", None)
    carrier = envelope.trace_context
    if not job_id or "traceparent" not in carrier:
        return
    JOBS.note(job_id, carrier)
    span = _tracer.start_span(
        f"process {record.topic}", context=propagate.extract(dict(carrier)), kind=SpanKind.CONSUMER,
        attributes={"messaging.system": "kafka", "messaging.operation.type": "process",
                    "messaging.destination.name": record.topic,
                    "messaging.destination.partition.id": str(record.partition),
                    "messaging.kafka.offset": record.offset, "messaging.consumer.group.name": _consumer,
                    "gpusched.event": type(event).__name__, "gpusched.job_id": job_id,
                    "gpusched.accepted": accepted})
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
