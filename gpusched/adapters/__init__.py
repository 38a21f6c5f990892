"""Thin adapters between the pure core and the outside: protobuf, Kafka, gRPC, NVML, OpenTelemetry."""
