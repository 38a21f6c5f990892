"""OpenTelemetry wiring: one tracer provider per process, W3C context through events.

The trace context travels inside the event envelope (``trace_context``) so a job's
submit -> place -> run spans join into one trace across services, whichever consumer
library reads the record. Exporter: OTLP when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set
and the exporter package is installed, the console when ``GPUSCHED_TRACE_CONSOLE=1``,
otherwise tracing stays off: the API's no-op tracer costs nothing per request, where a
recording provider with nowhere to send spans cost ~70 us per SubmitJob.
"""
from __future__ import annotations

from opentelemetry import context, propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

from gpusched.config import process_settings


def setup_tracing(service: str, exporter: SpanExporter | None = None, always: bool = False) -> trace.Tracer:
    """Install an SDK tracer provider when there is somewhere to send spans (or
    ``always``, for tests that attach their own processor)."""
    exporter = exporter or _exporter_from_env()
    if exporter is not None or always:
        provider = TracerProvider(resource=Resource.create({"service.name": service}))
        if exporter is not None:
            provider.add_span_processor(BatchSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
    return trace.get_tracer(service)


def _exporter_from_env() -> SpanExporter | None:
    settings = process_settings()
    if settings.otlp_endpoint:
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        except ImportError:
            return None
        return OTLPSpanExporter()
    if settings.trace_console:
        return ConsoleSpanExporter()
    return None


def current_context() -> dict[str, str]:
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier


def context_from(carrier: dict[str, str]) -> context.Context:
    return propagate.extract(dict(carrier))
