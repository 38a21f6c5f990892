"""API request -> domain spec, with the defaults a caller may leave out.

The API's ``JobSpec`` gives spans as ``google.protobuf.Duration`` and ``preemptible`` with
presence; the domain (and the log's ``JobSpecRecord``) keeps seconds and a plain bool. The
defaults are applied here, so the event written to the log always says what was meant."""
from __future__ import annotations

from google.protobuf import unknown_fields

from gpusched.adapters.api.api_time import span_seconds
from gpusched.adapters.log.codec import DecodeError, from_proto
from gpusched.core.model import Autoscaling, JobSpec, ScalingMetric, ServiceSpec, UpdateStrategy
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


def spec_from_request(msg: types_pb2.JobSpec, team: str = "", template: bool = False) -> JobSpec | FieldError:
    """``team``: the job's team where the caller left ``spec.team`` empty. ``template``:
    a service's replica template, the only spec that may say how it is found ready."""
    removed = _removed_field(msg)
    if removed is not None:
        return removed
    record = types_pb2.JobSpecRecord(**{name: getattr(msg, name) for name in _COPIED})
    if msg.HasField("readiness"):
        if not template:
            return FieldError("spec.readiness", "only a service's template (spec.template.readiness) takes one")
        readiness = _readiness_record(msg.readiness)
        if isinstance(readiness, FieldError):
            return readiness
        record.readiness.CopyFrom(readiness)
    record.serve_port = msg.serve_port
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
    if msg.HasField("topology"):
        record.topology.CopyFrom(msg.topology)
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


_READINESS_SPANS = (("period", "period_s"), ("timeout", "timeout_s"), ("initial_delay", "initial_delay_s"))


def _readiness_record(msg: types_pb2.ReadinessCheck) -> types_pb2.Readiness | FieldError:
    record = types_pb2.Readiness(http_path=msg.http_path, command=msg.command,
                                 success_threshold=msg.success_threshold, failure_threshold=msg.failure_threshold)
    for api, domain in _READINESS_SPANS:
        seconds = span_seconds(getattr(msg, api), f"spec.readiness.{api}")
        if isinstance(seconds, FieldError):
            return seconds
        setattr(record, domain, seconds)
    return record


# What a service request may leave unset, with what it means then (types.proto's
# ServiceSpec); the autoscaling defaults are core's ``Autoscaling``'s.
SERVICE_DEFAULTS = {"pool": "default", "priority_class": "production-inference", "preemptible": False,
                    "replicas": 1, "min_replicas": 1}
_AUTOSCALING, _UPDATE = Autoscaling(), UpdateStrategy()
_METRICS = {types_pb2.ScalingMetric.Value("SCALING_METRIC_" + m.name): m for m in ScalingMetric}


def template_error(error: FieldError) -> FieldError:
    """An error about a service's template spec, named as the service's field
    (``spec.template.max_runtime``)."""
    field = error.field
    if field.startswith("spec.") and field != "spec.pool" and not field.startswith("spec.template"):
        field = "spec.template." + field[len("spec."):]
    return FieldError(field, error.message)


def service_from_request(msg: types_pb2.ServiceSpec, team: str = "") -> ServiceSpec | FieldError:
    """The API's ServiceSpec as the domain's, with the defaults a caller may leave out;
    ``team``: the service's where ``spec.team`` is empty."""
    template = spec_from_request(msg.template, team, template=True)
    if isinstance(template, FieldError):
        return template_error(template)
    a = msg.autoscaling
    if a.metric not in _METRICS:
        return FieldError("spec.autoscaling.metric", f"one of none, requests_in_flight, requests_per_second, "
                                                     f"gpu_utilization; got {a.metric}")
    spans = {}
    for api, default in (("scale_down_window", _AUTOSCALING.scale_down_window_s), ("scale_to_zero_after", 0.0)):
        seconds = span_seconds(getattr(a, api), f"spec.autoscaling.{api}") if a.HasField(api) else default
        if isinstance(seconds, FieldError):
            return seconds
        spans[api + "_s"] = seconds
    autoscaling = Autoscaling(metric=_METRICS[a.metric], target=a.target,
                              tolerance=a.tolerance if a.HasField("tolerance") else _AUTOSCALING.tolerance,
                              max_scale_up=a.max_scale_up if a.HasField("max_scale_up") else _AUTOSCALING.max_scale_up,
                              **spans)
    d, u = SERVICE_DEFAULTS, msg.update
    update = UpdateStrategy(max_surge=u.max_surge if u.HasField("max_surge") else _UPDATE.max_surge,
                            max_unavailable=u.max_unavailable if u.HasField("max_unavailable")
                            else _UPDATE.max_unavailable)
    return ServiceSpec(
        name=msg.name, team=msg.team or team, template=template, pool=msg.pool or d["pool"],
        priority_class=msg.priority_class or d["priority_class"],
        preemptible=msg.preemptible if msg.HasField("preemptible") else d["preemptible"],
        replicas=msg.replicas if msg.HasField("replicas") else d["replicas"],
        min_replicas=msg.min_replicas if msg.HasField("min_replicas") else d["min_replicas"],
        max_replicas=msg.max_replicas, update=update, autoscaling=autoscaling, org=msg.org)
