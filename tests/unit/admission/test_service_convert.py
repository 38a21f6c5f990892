"""The API's ServiceSpec as the domain's (gpusched_admission.convert): the defaults a
request may leave out, spans from Durations, a readiness check only in a template, and
errors naming the API's field."""
from __future__ import annotations

from gpusched.client import spec
from gpusched.core.model import ScalingMetric
from gpusched.core.validation import FieldError
from gpusched.v1 import types_pb2
from gpusched_admission.convert import service_from_request, spec_from_request


def request(**kw) -> types_pb2.ServiceSpec:
    return types_pb2.ServiceSpec(name="web", template=spec("", "", gpus=1, command=("serve",)), **kw)


def test_what_a_request_leaves_out_takes_the_defaults():
    s = service_from_request(request(), team="ml")
    assert (s.team, s.pool, s.priority_class, s.preemptible) == ("ml", "default", "production-inference", False)
    assert (s.replicas, s.min_replicas, s.max_replicas) == (1, 1, 0)
    assert (s.update.max_surge, s.update.max_unavailable) == (1, 0)
    a = s.autoscaling
    assert (a.metric, a.tolerance, a.scale_down_window_s, a.max_scale_up, a.scale_to_zero_after_s) == \
        (ScalingMetric.NONE, 0.1, 300.0, 4, 0.0)


def test_set_values_are_kept_zeros_included():
    msg = request(team="nlp", replicas=0, min_replicas=0, max_replicas=5, preemptible=True)
    msg.update.max_surge, msg.update.max_unavailable = 0, 2
    msg.autoscaling.metric, msg.autoscaling.target = types_pb2.SCALING_METRIC_GPU_UTILIZATION, 70
    msg.autoscaling.scale_down_window.seconds, msg.autoscaling.scale_to_zero_after.seconds = 60, 900
    msg.template.serve_port = True
    msg.template.readiness.http_path = "/healthz"
    msg.template.readiness.period.seconds, msg.template.readiness.success_threshold = 5, 2
    s = service_from_request(msg)
    assert (s.team, s.replicas, s.min_replicas, s.max_replicas, s.preemptible) == ("nlp", 0, 0, 5, True)
    assert (s.update.max_surge, s.update.max_unavailable) == (0, 2)
    assert (s.autoscaling.metric, s.autoscaling.target) == (ScalingMetric.GPU_UTILIZATION, 70)
    assert (s.autoscaling.scale_down_window_s, s.autoscaling.scale_to_zero_after_s) == (60, 900)
    r = s.template.readiness
    assert s.template.serve_port and (r.http_path, r.period_s, r.success_threshold) == ("/healthz", 5, 2)


def test_errors_name_the_apis_field():
    bad_metric = request()
    bad_metric.autoscaling.metric = 9
    assert service_from_request(bad_metric).field == "spec.autoscaling.metric"
    negative = request()
    negative.template.readiness.period.seconds = -1
    assert service_from_request(negative) == FieldError("spec.template.readiness.period", "must not be negative (got -1s)")
    runtime = request()
    runtime.template.max_runtime.seconds = -5
    assert service_from_request(runtime).field == "spec.template.max_runtime"
    window = request()
    window.autoscaling.scale_down_window.seconds = -1
    assert service_from_request(window).field == "spec.autoscaling.scale_down_window"


def test_only_a_template_takes_a_readiness_check():
    job = spec("plain", "ml", gpus=1)
    job.readiness.command.append("true")
    error = spec_from_request(job)
    assert isinstance(error, FieldError) and error.field == "spec.readiness"
    assert spec_from_request(job, template=True).readiness.command == ("true",)


def test_a_topology_request_is_copied_to_the_job_and_shown_back_as_asked():
    from gpusched.adapters.api.views import spec_message
    from gpusched.core.model import TopologyRequest, TopologySlice

    msg = spec("g", "nlp", gpus=1, workers=4)
    assert spec_from_request(msg).topology == TopologyRequest()
    assert not spec_message(spec_from_request(msg)).HasField("topology")
    msg.topology.required, msg.topology.preferred = "rack", "block"
    msg.topology.slice.level, msg.topology.slice.workers = "block", 2
    job = spec_from_request(msg)
    assert job.topology == TopologyRequest("rack", "block", TopologySlice("block", 2))
    assert spec_message(job).topology == msg.topology
    web = service_from_request(types_pb2.ServiceSpec(name="web", template=msg))
    assert web.replica_spec().topology == job.topology   # a service's replicas ask what its template asks
