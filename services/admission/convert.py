"""API request -> domain spec, with the defaults a caller may leave out.

The API's ``JobSpec`` gives spans as ``google.protobuf.Duration`` and ``preemptible`` with
presence; the domain (and the log's ``JobSpecRecord``) keeps seconds and a plain bool. The
defaults are applied here, so the event written to the log always says what was meant."""
from __future__ import annotations

from google.protobuf import unknown_fields

from gpusched.adapters.api.api_time import span_seconds
from gpusched.adapters.log.codec import DecodeError, from_proto
from gpusched.core.model import JobSpec
from gpusched.core.validation import FieldError
from gpusched.v1 import types_pb2

# What a job may be preempted by default when the request leaves ``preemptible`` unset:
# as a Kubernetes pod under Kueue or KAI, whose workloads are preemptible unless their
# priority class says otherwise, and as the Python client and job files always were.
DEFAULT_PREEMPTIBLE = True

# API span field -> the domain's seconds field.
_SPANS = (("max_runtime", "max_runtime_s"), ("checkpoint_interval", "checkpoint_interval_s"),
          ("simulated_duration", "simulated_duration_s"))
_COPIED = ("name", "team", "pool", "priority_class", "kind", "command", "org")
# What a request may leave unset, with what it means then. Set to 0 (or to anything
# invalid), such a field is refused by validation, naming it: a gang of 0 is a mistake,
# not a request for the default.
DEFAULT_WORKERS = 1
# A retry rule's enums: the values this version knows (proto3 enums accept any number)
_CAUSES = {v for v in types_pb2.FailureCause.values() if v != types_pb2.FAILURE_CAUSE_UNSPECIFIED}
_ACTIONS = set(types_pb2.RetryAction.values())
_CONDITIONS = set(types_pb2.DependencyCondition.values())

# Field numbers the API's JobSpec had for seconds as doubles, and what replaced them: an
# old caller's value is refused, not silently dropped.
_REMOVED = {8: ("max_runtime_s", "max_runtime"), 10: ("checkpoint_interval_s", "checkpoint_interval"),
            12: ("simulated_duration_s", "simulated_duration")}

# Domain field names in core validation's errors -> the API's.
API_FIELDS = {"spec.max_runtime_s": "spec.max_runtime", "spec.checkpoint_interval_s": "spec.checkpoint_interval",
              "spec.simulated_duration_s": "spec.simulated_duration",
              "default_time_limit_s": "default_time_limit", "max_time_limit_s": "max_time_limit"}


def api_error(error: FieldError, where: str = "") -> FieldError:
    """``error`` from core validation, naming the API's field (``spec.max_runtime``)."""
    message = error.message
    for domain, api in API_FIELDS.items():
        message = message.replace(domain, api)
    return FieldError(where + API_FIELDS.get(error.field, error.field), message)


def spec_from_request(msg: types_pb2.JobSpec, team: str = "") -> JobSpec | FieldError:
    """``team``: the job's team where the caller left ``spec.team`` empty."""
    removed = _removed_field(msg)
    if removed is not None:
        return removed
    record = types_pb2.JobSpecRecord(**{name: getattr(msg, name) for name in _COPIED})
    record.resources.CopyFrom(msg.resources)
    if msg.HasField("max_restarts"):
        record.max_restarts = msg.max_restarts
    for i, rule in enumerate(msg.retry):
        if rule.cause not in _CAUSES:
            return FieldError(f"spec.retry[{i}].cause", "required: one of exit, oom, hang, node, preemption")
        if rule.action not in _ACTIONS:
            return FieldError(f"spec.retry[{i}].action", f"one of count, ignore, fail; got {rule.action}")
    record.retry.extend(msg.retry)
    for i, dep in enumerate(msg.depends_on):
        if dep.when not in _CONDITIONS:
            return FieldError(f"spec.depends_on[{i}].when", f"one of succeeded, finished, failed; got {dep.when}")
    record.depends_on.extend(msg.depends_on)
    record.array.CopyFrom(msg.array)
    record.preemptible = msg.preemptible if msg.HasField("preemptible") else DEFAULT_PREEMPTIBLE
    for api, domain in _SPANS:
        seconds = span_seconds(getattr(msg, api), f"spec.{api}")
        if isinstance(seconds, FieldError):
            return seconds
        setattr(record, domain, seconds)
    record.team = record.team or team
    if record.kind == types_pb2.JOB_KIND_UNSPECIFIED:
        record.kind = types_pb2.JOB_KIND_TRAINING
    record.pool = record.pool or "default"
    record.priority_class = record.priority_class or "training"
    record.workers = msg.workers if msg.HasField("workers") else DEFAULT_WORKERS
    if record.resources.gpu_milli == 1000 and record.resources.gpus == 0:
        record.resources.gpus, record.resources.gpu_milli = 1, 0   # a full share is a whole GPU
    try:
        return from_proto(JobSpec, record)
    except (DecodeError, ValueError, KeyError) as exc:
        return FieldError("spec.kind", str(exc))


def _removed_field(msg: types_pb2.JobSpec) -> FieldError | None:
    for unknown in unknown_fields.UnknownFieldSet(msg):
        if unknown.field_number in _REMOVED:
            old, new = _REMOVED[unknown.field_number]
            return FieldError(f"spec.{old}", f"replaced by spec.{new}, a google.protobuf.Duration "
                                             f"(field {unknown.field_number} is no longer read)")
    return None
