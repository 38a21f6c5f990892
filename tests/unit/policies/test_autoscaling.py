"""The autoscaler's rule (``policies.autoscaling``, Kubernetes' HPA): proportional with a
tolerance, scale-down held to the highest recommendation of its window, scale-up at most
``max_scale_up`` a minute, bounds, scale to zero after an idle time. Tables, then a
property over random load histories."""
from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.core import events as ev
from gpusched.core.model import Autoscaling, JobSpec, ScalingMetric, ServiceSpec, WorkerResources
from gpusched.core.reducer import apply
from gpusched.core.state import ClusterState, ServiceState
from gpusched.policies.actions import make_actions
from gpusched.policies.autoscaling import RATE_WINDOW_S, ReplicaLoad, ScaleMemory, recommend
from gpusched.policies.preemption.victim_rules import PreemptionConfig
from gpusched.policies.supervision import SupervisionConfig
from gpusched_preemptor.decide import PreemptorDecider

TEMPLATE = JobSpec(name="", team="", resources=WorkerResources(gpus=1), command=("serve",), serve_port=True)


def service(desired: int, min_replicas: int = 1, max_replicas: int = 10, **rule) -> ServiceState:
    rule = {"metric": ScalingMetric.REQUESTS_IN_FLIGHT, "target": 2.0, "scale_down_window_s": 300.0, **rule}
    spec = ServiceSpec(name="web", team="a", template=TEMPLATE, replicas=desired, min_replicas=min_replicas,
                       max_replicas=max_replicas, autoscaling=Autoscaling(**rule))
    ready = {f"r{i}": f"n:{i}" for i in range(desired)}
    return ServiceState(spec, 0.0, desired=desired, replicas={r: 1 for r in ready}, ready=ready)


def loads(svc: ServiceState, now: float, in_flight: float, per_second: float = 1.0) -> dict[str, ReplicaLoad]:
    return {r: ReplicaLoad(now, in_flight, per_second) for r in svc.ready}


def test_proportional_to_the_mean_over_ready_replicas():
    svc = service(2)
    got = recommend(svc, loads(svc, 10, 10.0), ScaleMemory(0.0), 10.0)
    assert got is not None and got.replicas == 6   # ceil(2 x 10/2) = 10, at most 4 more a minute
    assert "requests_in_flight 10 per replica over 2, target 2" in got.reason
    svc = service(2)
    assert recommend(svc, loads(svc, 10, 3.0), ScaleMemory(0.0), 10.0).replicas == 3


def test_within_the_tolerance_nothing_changes():
    svc = service(4)
    assert recommend(svc, loads(svc, 10, 2.15), ScaleMemory(0.0), 10.0) is None
    assert recommend(svc, loads(svc, 10, 2.3), ScaleMemory(0.0), 10.0).replicas == 5


def test_scale_down_waits_for_the_window():
    svc = service(4)
    memory = ScaleMemory(0.0)
    for t in (10.0, 100.0, 299.0):
        assert recommend(svc, loads(svc, t, 0.5), memory, t) is None   # the start counts as recommending 4
    got = recommend(svc, loads(svc, 301.0, 0.5), memory, 301.0)
    assert got is not None and got.replicas == 1


def test_scale_up_is_rate_limited_per_minute():
    svc = service(1, max_replicas=20, max_scale_up=2)
    memory = ScaleMemory(0.0)
    assert recommend(svc, loads(svc, 1, 20.0), memory, 1.0).replicas == 3
    svc.desired = 3
    assert recommend(svc, loads(svc, 2, 20.0), memory, 2.0) is None       # 2 added within the minute
    got = recommend(svc, loads(svc, 1 + RATE_WINDOW_S + 1, 20.0), memory, 1 + RATE_WINDOW_S + 1)
    assert got.replicas == 5


def test_bounds_and_nothing_without_measurements():
    svc = service(3, min_replicas=2, max_replicas=4)
    memory = ScaleMemory(-1000.0)
    assert recommend(svc, loads(svc, 10, 100.0), memory, 10.0).replicas == 4
    assert recommend(svc, {}, memory, 10.0) is None
    stale = loads(svc, 10.0, 100.0)
    assert recommend(svc, stale, memory, 100.0) is None                  # older than fresh_s
    unready = service(3)
    unready.ready = {}
    assert recommend(unready, loads(service(3), 10, 100.0), ScaleMemory(0.0), 10.0) is None


def test_scale_to_zero_after_the_idle_time_and_never_up_from_zero():
    svc = service(2, min_replicas=0, scale_to_zero_after_s=60.0)
    memory = ScaleMemory(0.0)
    assert recommend(svc, loads(svc, 30, 1.0), memory, 30.0) is None     # busy at 30
    assert recommend(svc, loads(svc, 80, 0.0, 0.0), memory, 80.0) is None   # idle 50 s
    got = recommend(svc, loads(svc, 91, 0.0, 0.0), memory, 91.0)
    assert got.replicas == 0 and "no request for 60s" in got.reason
    svc.desired = 0
    assert recommend(svc, {}, memory, 100.0) is None


def test_gpu_utilization_and_requests_per_second_are_read_from_their_fields():
    svc = service(2, metric=ScalingMetric.GPU_UTILIZATION, target=50.0)
    got = recommend(svc, {r: ReplicaLoad(1.0, gpu_percent=100.0) for r in svc.ready}, ScaleMemory(0.0), 1.0)
    assert got.replicas == 4
    svc = service(2, metric=ScalingMetric.REQUESTS_PER_SECOND, target=10.0)
    got = recommend(svc, {r: ReplicaLoad(1.0, 0.0, 15.0) for r in svc.ready}, ScaleMemory(0.0), 1.0)
    assert got.replicas == 3


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 30), st.floats(0.5, 40)), min_size=1, max_size=60),
       st.integers(1, 5), st.integers(0, 3), st.integers(4, 12))
def test_bounds_rate_and_window_hold(history, max_scale_up, min_replicas, max_replicas):
    svc = service(max(1, min_replicas), min_replicas=min_replicas, max_replicas=max_replicas,
                  max_scale_up=max_scale_up, scale_down_window_s=120.0)
    memory = ScaleMemory(0.0)
    now, changes = 0.0, []
    for load, step in history:
        now += step
        got = recommend(svc, loads(svc, now, load), memory, now)
        if got is None:
            continue
        assert max(min_replicas, 1) <= got.replicas <= max_replicas
        changes.append((now, svc.desired, got.replicas))
        svc = dataclasses.replace(svc, desired=got.replicas,
                                  ready={f"r{i}": "n:1" for i in range(got.replicas)})
    for i, (t, before, after) in enumerate(changes):
        added = sum(a - b for tt, b, a in changes if t - RATE_WINDOW_S <= tt <= t and a > b)
        assert added <= max_scale_up
        if after < before:   # no scale-down within the window of a higher recommendation it made
            assert not any(b2 < a2 and t - 120.0 <= t2 < t and a2 > after for t2, b2, a2 in changes[:i])


def test_the_preemptors_autoscale_action_writes_the_scale_to_the_services_pool_log():
    state = ClusterState()
    state.pools["serving"] = None
    spec = service(2).spec
    spec = dataclasses.replace(spec, pool="serving")
    assert apply(state, ev.ServiceApplied(event_id="a", time=1.0, spec=spec)).accepted
    svc = state.services["web"]
    svc.ready = {job_id: "n:1" for job_id in svc.replicas}   # as if both were ready
    loads = {job_id: ReplicaLoad(10.0, 5.0, 1.0) for job_id in svc.replicas}
    decider = PreemptorDecider("p", PreemptionConfig(), SupervisionConfig(), lambda now: ({}, 0.0, False),
                               make_actions(("autoscale",)), loads)
    ((event, pool),) = decider(0, state, 10.0)
    assert pool == "serving" and isinstance(event, ev.ServiceScaled)
    assert (event.service, event.replicas) == ("web", 5) and event.reason.startswith("autoscaler:")
    assert decider.memory[0].scaling["web"].recommended     # remembered for the window
