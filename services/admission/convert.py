"""API request -> domain spec, with the defaults a caller may leave out."""
from __future__ import annotations

from gpusched.adapters.codec import DecodeError, from_proto
from gpusched.core.model import JobSpec
from gpusched.core.validation import FieldError
from gpusched.v1 import types_pb2


def spec_from_request(msg: types_pb2.JobSpec, team: str = "") -> JobSpec | FieldError:
    """``team``: the job's team where the caller left ``spec.team`` empty."""
    msg = types_pb2.JobSpec.FromString(msg.SerializeToString())   # never mutate the caller's
    msg.team = msg.team or team
    if msg.kind == types_pb2.JOB_KIND_UNSPECIFIED:
        msg.kind = types_pb2.JOB_KIND_TRAINING
    msg.pool = msg.pool or "default"
    msg.priority_class = msg.priority_class or "training"
    msg.workers = msg.workers or 1
    if msg.resources.gpu_milli == 1000 and msg.resources.gpus == 0:
        msg.resources.gpus, msg.resources.gpu_milli = 1, 0   # a full share is a whole GPU
    try:
        return from_proto(JobSpec, msg)
    except (DecodeError, ValueError, KeyError) as exc:
        return FieldError("spec.kind", str(exc))
