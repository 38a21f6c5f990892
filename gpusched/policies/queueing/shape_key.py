"""A waiting job's shape — (pool, workers, per-worker resources, and its topology request
where it has one), what decides whether it fits — as one flat tuple of plain values, for the dicts that count or number shapes
(``fair_queue``'s census, ``keys``' shape numbers).

``WorkerResources`` is a frozen dataclass: its ``__hash__`` and ``__eq__`` are Python
calls, which were most of what keying a shape by it cost in a cold cycle. A tuple of
ints, strings and a tuple of strings hashes and compares in C, and two keys are equal
exactly when the shapes are (a field added to ``WorkerResources`` must be added here).
"""
from __future__ import annotations

from gpusched.core.model import JobSpec
from gpusched.core.topology import NO_REQUEST


def shape_key(spec: JobSpec) -> tuple:
    """The spec's shape in plain values, its pool first: equal when the shapes are."""
    r = spec.resources
    flat = (spec.pool, spec.workers, r.gpus, r.gpu_milli, r.mig_profile, r.cpu_milli, r.memory_mib,
            r.gpu_models, r.gpu_memory_mib)
    return flat if spec.topology == NO_REQUEST else (*flat, spec.topology)
