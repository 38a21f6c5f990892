"""Adapters for traces and metrics (OpenTelemetry, Prometheus)."""
