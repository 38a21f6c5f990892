"""The pure domain core: resources, events, state and the reducer.

Nothing in this package imports Kafka, gRPC, protobuf or NVML, reads a clock, draws a
random number or does I/O. Every service and the simulator share it, so a figure from
the simulator is a figure of the production code and two replicas that applied the same
log prefix hold the same state (see ``digest``).

Importing the package picks how its reducer modules are loaded: compiled by mypyc when
the package build (or ``deploy/build_parts.py``) built them for these very sources, else the ``.py`` files
(``gpusched.native``). Both fold a log to the same state (tests/unit/core/test_native.py).
"""
from gpusched import native

# The reducer's modules, compiled when built for these very sources (gpusched.native).
__path__ = native.core_path(__path__)
