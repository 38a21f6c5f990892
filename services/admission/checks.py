"""Checks of API requests beyond the job spec (gpusched.core.validation has the spec's):
sizes of every other string, ListJobs' phases, pools that exist, and an idempotency key
reused with another spec. Each raises ``RequestRefused`` naming the field."""
from __future__ import annotations

import grpc

from gpusched.adapters.api.grpc_server import RequestRefused
from gpusched.core.model import JobPhase, JobSpec
from gpusched.core.state import JobState
from gpusched.core.validation import FieldError, check_known_pool, check_length
from gpusched.v1 import types_pb2

_PHASES = {value: JobPhase[name[len("JOB_PHASE_"):]]
           for name, value in types_pb2.JobPhase.items() if value != types_pb2.JOB_PHASE_UNSPECIFIED}


async def abort_invalid(context, errors: list[FieldError]) -> None:
    """End the call with INVALID_ARGUMENT naming each field."""
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "; ".join(map(str, errors)))


def refuse_invalid(errors: list[FieldError]) -> None:
    if errors:
        raise RequestRefused(grpc.StatusCode.INVALID_ARGUMENT, "; ".join(map(str, errors)))


def check_lengths(*fields: tuple[str, str, int]) -> None:
    """(field, value, limit) triples; INVALID_ARGUMENT naming each one too long."""
    refuse_invalid([e for name, value, limit in fields for e in check_length(name, value, limit)])


def phases_of(values, limit: int) -> set[JobPhase]:
    """ListJobs' phase filter; an unknown enum value (proto3 keeps them) names its index."""
    if len(values) > limit:
        refuse_invalid([FieldError("phases", f"at most {limit} phases, got {len(values)}")])
    errors = [FieldError(f"phases[{i}]", f"unknown phase {v}; one of {sorted(_PHASES)} or 0 (any)")
              for i, v in enumerate(values) if v != types_pb2.JOB_PHASE_UNSPECIFIED and v not in _PHASES]
    refuse_invalid(errors)
    return {_PHASES[v] for v in values if v != types_pb2.JOB_PHASE_UNSPECIFIED}


def pool_errors(spec: JobSpec, known) -> list[FieldError]:
    return check_known_pool(spec.pool, known)


def check_same_spec(existing: JobState, spec: JobSpec, field: str = "idempotency_key") -> None:
    """A key names one request: reused with another spec it is refused (as payment APIs
    do), not answered with the first job as if the new spec had been taken."""
    if existing.spec != spec:
        raise RequestRefused(grpc.StatusCode.ALREADY_EXISTS,
                             f"{field}: already used for job {existing.job_id} with a different spec; "
                             "use a new key for a new request")
