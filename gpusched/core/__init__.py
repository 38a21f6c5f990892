"""The pure domain core: resources, events, state and the reducer.

Nothing in this package imports Kafka, gRPC, protobuf or NVML, reads a clock, draws a
random number or does I/O. Every service and the simulator share it, so a figure from
the simulator is a figure of the production code and two replicas that applied the same
log prefix hold the same state (see ``digest``).
"""
