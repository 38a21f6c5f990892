"""Services (``ServiceSpec``): the reducer keeps each service's replicas as
``core.services.plan`` says. Table cases of the rule alone, then through the log (scale,
replace a failed replica alone, roll out a new template within surge and unavailability,
stall on a template that never gets ready, drain, delete, bad specs), then a property:
over random histories the rollout's bounds hold and a replay agrees."""
from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.core import events as ev
from gpusched.core.digest import digest
from gpusched.core.model import Autoscaling, JobPhase, Readiness, ScalingMetric, ServiceSpec, TopologyRequest, UpdateStrategy
from gpusched.core.reducer import apply
from gpusched.core.services import Replica, plan, removal_order
from gpusched.core.snapshot import snapshot_bytes, state_from_snapshot
from gpusched.core.state import ClusterState
from gpusched.core.validation import check_service_alone
from tests.unit.core.builders import Log, make_node, make_spec, whole


def service(replicas: int = 2, surge: int = 1, unavailable: int = 0, command: tuple[str, ...] = ("serve", "v1"),
            **kw) -> ServiceSpec:
    template = dataclasses.replace(make_spec(), command=command, serve_port=True,
                                   readiness=Readiness(http_path="/healthz"))
    return ServiceSpec(name="web", team="team-a", template=template, replicas=replicas,
                       update=UpdateStrategy(surge, unavailable), **kw)


def replicas(log: Log, name: str = "web") -> list[str]:
    return list(log.state.services[name].replicas)


def serve(log: Log, job_id: str, gpu: int, node: str = "n1", ready: bool = True) -> None:
    """Place and start the replica and report it ready (``ready``: else only start it)."""
    log.run(job_id, (node, whole(gpu)))
    if not ready:
        return
    out = log(ev.ReplicaReadiness, job_id=job_id, attempt=log.job(job_id).attempt, ready=True,
              address=node, port=9000 + gpu)
    assert out.accepted, out.reason


def free_gpu(log: Log, node: str = "n1") -> int:
    return next(g.info.index for g in log.node(node).gpus if g.used_milli == 0)


def serve_pending(log: Log, name: str = "web") -> None:
    for job_id in replicas(log, name):
        if log.job(job_id).phase is JobPhase.PENDING:
            serve(log, job_id, free_gpu(log))


# --- the rule alone -----------------------------------------------------------------
def r(job_id: str, revision: int = 1, ready: bool = True, placed: bool = True, load: int = 0, made: int = 0):
    return Replica(job_id, revision, ready, placed, load, made)


def test_steady_state_makes_the_missing_and_stops_the_extra():
    assert plan(3, 1, UpdateStrategy(), [r("a")]) == ((), 2)
    extra = [r("a", load=3000, made=0), r("b", load=1000, made=1), r("c", ready=False, made=2)]
    assert plan(1, 1, UpdateStrategy(), extra) == (("c", "b"), 0)


def test_removal_takes_unplaced_then_unready_then_the_emptiest_node_newest_first():
    order = removal_order([r("ready-full", load=4000), r("ready-empty-old", load=1000, made=1),
                           r("ready-empty-new", load=1000, made=2), r("unready", ready=False),
                           r("pending", ready=False, placed=False)])
    assert [x.job_id for x in order] == ["pending", "unready", "ready-empty-new", "ready-empty-old", "ready-full"]


def test_rolling_update_with_surge_makes_one_before_stopping_one():
    old = [r(f"o{i}") for i in range(4)]
    assert plan(4, 2, UpdateStrategy(1, 0), old) == ((), 1)
    assert plan(4, 2, UpdateStrategy(1, 0), old + [r("n0", 2, ready=False)]) == ((), 0)   # waits for readiness
    stop, make = plan(4, 2, UpdateStrategy(1, 0), old + [r("n0", 2)])
    assert len(stop) == 1 and make == 1


def test_rolling_update_with_unavailability_stops_one_then_makes_one():
    old = [r(f"o{i}") for i in range(4)]
    stop, make = plan(4, 2, UpdateStrategy(0, 1), old)
    assert len(stop) == 1 and make == 1


def test_old_replicas_that_are_not_ready_go_first():
    old = [r("o0"), r("o1", ready=False)]
    assert plan(2, 2, UpdateStrategy(1, 0), old) == (("o1",), 2)   # 1 old + 2 new: the surge allows 3


# --- through the log ----------------------------------------------------------------
def test_a_service_makes_its_replicas_and_scales():
    log = Log(make_node("n1", gpus=4))
    out = log(ev.ServiceApplied, spec=service(2))
    assert out.accepted, out.reason
    made = replicas(log)
    assert len(made) == 2 and set(out.jobs) == set(made)
    job = log.job(made[0])
    assert job.spec.service == "web" and job.spec.kind.value == "inference"
    assert job.spec.priority_class == "production-inference" and not job.spec.preemptible
    assert all(j in log.state.pending for j in made)
    serve_pending(log)
    assert len(log.state.services["web"].ready) == 2
    assert log(ev.ServiceScaled, service="web", replicas=4, reason="gpusched scale").accepted
    assert len(replicas(log)) == 4
    serve_pending(log)
    assert log(ev.ServiceScaled, service="web", replicas=1).accepted
    left = replicas(log)
    assert len(left) == 1 and left[0] == made[0]           # the newest went first, the oldest stays
    stopping = [j for j in made + list(log.state.jobs) if log.job(j).phase is JobPhase.STOPPING]
    assert len(set(stopping)) == 3
    assert set(log.state.services["web"].ready) == {made[0]}   # drained: out of the endpoints at once


def test_a_failed_replica_is_replaced_alone():
    log = Log(make_node("n1", gpus=4))
    spec = service(3)
    log(ev.ServiceApplied, spec=dataclasses.replace(spec, template=dataclasses.replace(spec.template, max_restarts=0)))
    serve_pending(log)
    first = replicas(log)
    out = log.finish(first[1], 0, 1)
    assert out.accepted
    now = replicas(log)
    assert log.job(first[1]).phase is JobPhase.FAILED
    assert now[:1] == first[:1] and now[1] == first[2] and now[2] not in first
    assert all(log.job(j).phase is JobPhase.RUNNING for j in (first[0], first[2]))   # the others untouched
    assert log.state.services["web"].replaced == 1
    assert log.job(now[2]).phase is JobPhase.PENDING


def test_rollout_replaces_every_replica_within_surge_and_unavailability():
    log = Log(make_node("n1", gpus=8))
    log(ev.ServiceApplied, spec=service(4))
    serve_pending(log)
    old = set(replicas(log))
    assert log(ev.ServiceApplied, spec=service(4, command=("serve", "v2"))).accepted
    svc = log.state.services["web"]
    assert svc.revision == 2
    for _ in range(20):
        live = len(svc.replicas)
        ready = len(svc.ready)
        assert live <= 4 + 1 and ready >= 4
        if not old & set(svc.replicas) and len(svc.ready) == 4:
            break
        serve_pending(log)
    assert not old & set(svc.replicas) and len(svc.ready) == 4
    assert all(log.job(j).spec.command == ("serve", "v2") for j in svc.replicas)


def test_a_template_that_never_gets_ready_stalls_the_rollout_with_the_old_replicas_serving():
    log = Log(make_node("n1", gpus=8))
    log(ev.ServiceApplied, spec=service(3, surge=1, unavailable=1))
    serve_pending(log)
    assert log(ev.ServiceApplied, spec=service(3, surge=1, unavailable=1, command=("broken",))).accepted
    svc = log.state.services["web"]
    for job_id in [j for j, rev in svc.replicas.items() if rev == 2]:
        log.run(job_id, ("n1", whole(free_gpu(log))))   # runs, never ready
    assert len(svc.ready) == 2 and all(svc.replicas[j] == 1 for j in svc.ready)
    assert len(svc.replicas) == 4                          # 2 old serving, 2 new not ready: the rollout waits
    undo = log(ev.ServiceApplied, spec=service(3, surge=1, unavailable=1))   # rollback: the old template again
    assert undo.accepted and svc.revision == 3
    serve_pending(log)
    assert len(svc.ready) == 3 and all(log.job(j).spec.command == ("serve", "v1") for j in svc.replicas)


def test_re_applying_keeps_the_scaled_count_unless_the_file_changes_it():
    log = Log(make_node("n1", gpus=8))
    log(ev.ServiceApplied, spec=service(2))
    log(ev.ServiceScaled, service="web", replicas=5, reason="autoscaler")
    log(ev.ServiceApplied, spec=service(2))
    assert log.state.services["web"].desired == 5
    log(ev.ServiceApplied, spec=service(3))
    assert log.state.services["web"].desired == 3


def test_readiness_of_a_stale_attempt_or_a_job_that_is_not_a_replica_is_refused():
    log = Log(make_node("n1", gpus=4))
    log(ev.ServiceApplied, spec=service(1))
    job_id = replicas(log)[0]
    assert not log(ev.ReplicaReadiness, job_id=job_id, attempt=0, ready=True).accepted   # not placed yet
    log.submit("plain")
    log.run("plain", ("n1", whole(1)))
    assert not log(ev.ReplicaReadiness, job_id="plain", attempt=0, ready=True).accepted
    serve(log, job_id, 0)
    log.stopped(job_id, code=1, signal=0)   # the attempt failed: retried, out of the endpoints
    assert job_id not in log.state.services["web"].ready
    assert not log(ev.ReplicaReadiness, job_id=job_id, attempt=0, ready=True).accepted


def test_deleting_a_service_stops_its_replicas():
    log = Log(make_node("n1", gpus=4))
    log(ev.ServiceApplied, spec=service(2))
    made = replicas(log)
    serve(log, made[0], 0)
    assert log(ev.ServiceDeleted, service="web").accepted
    assert "web" not in log.state.services
    assert log.job(made[0]).phase is JobPhase.STOPPING and log.job(made[1]).phase is JobPhase.CANCELLED
    log.stopped(made[0])
    assert log.job(made[0]).phase is JobPhase.CANCELLED and log.state.pending == {}


def test_bad_specs_are_refused_naming_the_field_and_change_nothing():
    log = Log(make_node("n1", gpus=4))
    cases = {
        "spec.replicas": service(-1),
        "spec.min_replicas": service(2, min_replicas=3, max_replicas=2),
        "spec.update.max_surge": service(2, surge=0, unavailable=0),
        "spec.template.readiness.http_path": dataclasses.replace(
            service(2), template=dataclasses.replace(service(2).template, serve_port=False)),
        "spec.name": dataclasses.replace(service(2), name="Web_1"),
        "spec.autoscaling.target": service(2, max_replicas=4,
                                           autoscaling=Autoscaling(metric=ScalingMetric.GPU_UTILIZATION)),
    }
    before = digest(log.state)
    for field, spec in cases.items():
        errors = check_service_alone(spec)
        assert errors and errors[0].field == field, (field, errors)
        out = log(ev.ServiceApplied, spec=spec)
        assert not out.accepted and field in out.reason
    assert log.state.services == {} and log.state.jobs == {}
    assert not log(ev.ServiceScaled, service="web", replicas=2).accepted
    log(ev.ServiceApplied, spec=service(2, max_replicas=3))
    assert not log(ev.ServiceScaled, service="web", replicas=4).accepted
    assert not log(ev.ServiceApplied, spec=dataclasses.replace(service(2), team="team-b")).accepted
    assert before != digest(log.state)


# --- property -----------------------------------------------------------------------
steps = st.lists(st.one_of(
    st.tuples(st.just("scale"), st.integers(0, 5)),
    st.tuples(st.just("roll"), st.integers(1, 3)),
    st.tuples(st.just("serve"), st.integers(0, 7)),
    st.tuples(st.just("unready"), st.integers(0, 7)),
    st.tuples(st.just("fail"), st.integers(0, 7)),
), max_size=40)


@settings(max_examples=150, deadline=None)
@given(steps, st.integers(0, 2), st.integers(0, 2))
def test_bounds_hold_and_a_replay_agrees(history, surge, unavailable):
    if surge == unavailable == 0:
        surge = 1
    log = Log(make_node("n1", gpus=8), make_node("n2", gpus=8))
    log(ev.ServiceApplied, spec=service(2, surge, unavailable, min_replicas=0))
    svc = log.state.services["web"]
    version = 1
    for kind, arg in history:
        live = list(svc.replicas)
        if kind == "scale":
            log(ev.ServiceScaled, service="web", replicas=arg)
        elif kind == "roll":
            version += arg
            log(ev.ServiceApplied, spec=service(svc.spec.replicas, surge, unavailable, min_replicas=0,
                                                command=("serve", f"v{version}")))
        elif live:
            job = log.job(live[arg % len(live)])
            if kind == "serve" and job.phase is JobPhase.PENDING:
                node = "n1" if any(g.used_milli == 0 for g in log.node("n1").gpus) else "n2"
                serve(log, job.job_id, free_gpu(log, node), node)
            elif kind == "unready" and job.job_id in svc.ready:
                log(ev.ReplicaReadiness, job_id=job.job_id, attempt=job.attempt, ready=False)
            elif kind == "fail" and job.phase is JobPhase.RUNNING:
                log.finish(job.job_id, 0, 1)
        old = [j for j, rev in svc.replicas.items() if rev != svc.revision]
        if old:   # mid-rollout: never more than the surge above the desired count
            assert len(svc.replicas) <= max(svc.desired + surge, len(old))
        else:
            assert len(svc.replicas) == svc.desired
        assert set(svc.ready) <= set(svc.replicas)
        assert all(log.job(j).phase in (JobPhase.PLACED, JobPhase.RUNNING) for j in svc.ready)
        assert all(not log.job(j).phase.terminal and log.job(j).stop_then == "" for j in svc.replicas)
    replayed = ClusterState()
    for event in log.events:
        replayed.pools["default"] = None
        apply(replayed, event)
    assert digest(replayed) == digest(log.state)
    assert digest(state_from_snapshot(snapshot_bytes(log.state))) == digest(log.state)


def test_a_template_naming_a_level_its_pool_lacks_is_refused():
    log = Log(make_node("n1", gpus=4))
    spec = service(1)
    racked = dataclasses.replace(spec, template=dataclasses.replace(
        spec.template, workers=2, topology=TopologyRequest(required="block")))
    out = log(ev.ServiceApplied, spec=racked)
    assert not out.accepted and "spec.topology.required" in out.reason and "block" in out.reason
    assert log(ev.PoolTopologySet, pool="default", levels=("rack", "block")).accepted
    assert log(ev.ServiceApplied, spec=racked).accepted


def test_replacements_of_a_crash_looping_replica_back_off_until_one_is_ready():
    """Each replica that ends on its own before any became ready makes its replacement wait
    twice as long (Kubernetes' CrashLoopBackOff); a ready replica resets the count; a
    replica stopped by a scale-down is no crash."""
    log = Log(make_node("n1", gpus=4))
    spec = service(1)
    once = dataclasses.replace(spec, template=dataclasses.replace(spec.template, max_restarts=0))
    log(ev.ServiceApplied, spec=once)
    waits = []
    for _ in range(4):
        (job_id,) = replicas(log)
        job = log.job(job_id)
        waits.append(job.not_before - job.submitted_at if job.not_before else 0.0)
        serve(log, job_id, free_gpu(log), ready=False)
        assert log.finish(job_id, 0, 1).accepted
    assert waits == [0.0, 1.0, 2.0, 4.0]
    assert log.state.services["web"].crash_loop == 4
    (job_id,) = replicas(log)
    serve(log, job_id, free_gpu(log))
    assert log.state.services["web"].crash_loop == 0
    assert log(ev.ServiceScaled, service="web", replicas=2).accepted
    serve_pending(log)
    assert log(ev.ServiceScaled, service="web", replicas=1).accepted   # one stopped: no crash
    assert log.state.services["web"].crash_loop == 0
