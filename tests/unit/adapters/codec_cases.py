"""Events and bytes for the codec tests: hypothesis strategies of every domain event
(``EVENTS``, ``any_event``, with ``FAST`` settings) and records that are not a valid
event (``BAD``)."""
from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from gpusched.core import events as ev
from gpusched.core.model import (
    ArraySpec, Dependency, DependencyCondition, FailureCause, GpuInfo, GpuSlot, JobKind, JobSpec, NodeCount, NodeInfo, PendingKind, PendingReason, WorkerAssignment,
    TopologyRequest, TopologySlice,
    RetryAction, RetryRule, WorkerResources, Autoscaling, Readiness, ScalingMetric, ServiceSpec, UpdateStrategy,
)
from gpusched.core.policy import Quota, TeamPolicy
from gpusched.v1 import events_pb2, types_pb2


FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# --- strategies matching the proto field types ----------------------------------------
text = st.text(max_size=12)                                 # no surrogates: valid UTF-8
ids = st.text(min_size=1, max_size=12)
i32 = st.integers(-(2 ** 31), 2 ** 31 - 1)
i64 = st.integers(-(2 ** 63), 2 ** 63 - 1)
f64 = st.floats(allow_nan=False)                            # NaN != NaN; everything else is exact
words = st.lists(text, max_size=3).map(tuple)

gpu_infos = st.builds(GpuInfo, index=i32, uuid=text, model=text, memory_mib=i64, mig_capable=st.booleans())
node_infos = st.builds(
    NodeInfo, name=text, pool=text, cpu_milli=i64, memory_mib=i64,
    gpus=st.lists(gpu_infos, max_size=3).map(tuple),
    # a proto map has no order and one value per key: the canonical form is sorted pairs
    labels=st.dictionaries(text, text, max_size=3).map(lambda d: tuple(sorted(d.items()))),
    simulated=st.booleans(), agent_id=text, address=text, lease_s=f64, kill_wait_s=f64,
)
resources = st.builds(
    WorkerResources, gpus=i32, gpu_milli=i32, mig_profile=text, cpu_milli=i64, memory_mib=i64,
    gpu_models=words,
)
# every cause but the API's zero value, which the log never holds (admission refuses it)
retry_rules = st.builds(RetryRule, cause=st.sampled_from([c for c in FailureCause if c is not FailureCause.UNSPECIFIED]),
                        exit_codes=st.lists(i32, max_size=3).map(tuple), action=st.sampled_from(RetryAction),
                        max_restarts=i32)
job_specs = st.builds(
    JobSpec, name=text, team=text, pool=text, priority_class=text, kind=st.sampled_from(JobKind),
    workers=i32, resources=resources, max_runtime_s=f64, preemptible=st.booleans(),
    checkpoint_interval_s=f64, command=words, simulated_duration_s=f64, org=text, max_restarts=i32,
    retry=st.lists(retry_rules, max_size=3).map(tuple),
    depends_on=st.lists(st.builds(Dependency, job=text, when=st.sampled_from(DependencyCondition)),
                        max_size=3).map(tuple),
    array=st.builds(ArraySpec, count=i32, parallel=i32),
    service=text, serve_port=st.booleans(),
    readiness=st.builds(Readiness, http_path=text, command=words, period_s=f64, timeout_s=f64, initial_delay_s=f64,
                        success_threshold=i32, failure_threshold=i32),
    topology=st.builds(TopologyRequest, required=text, preferred=text,
                       slice=st.builds(TopologySlice, level=text, workers=i32)),
)
service_specs = st.builds(
    ServiceSpec, name=text, team=text, template=job_specs, pool=text, priority_class=text, preemptible=st.booleans(),
    replicas=i32, min_replicas=i32, max_replicas=i32,
    update=st.builds(UpdateStrategy, max_surge=i32, max_unavailable=i32),
    autoscaling=st.builds(Autoscaling, metric=st.sampled_from(ScalingMetric), target=f64, tolerance=f64,
                          scale_down_window_s=f64, max_scale_up=i32, scale_to_zero_after_s=f64),
    org=text,
)
slots = st.builds(GpuSlot, index=i32, milli=i32, mig_profile=text, mig_start=i32)
assignments = st.builds(WorkerAssignment, worker=i32, node=text, gpus=st.lists(slots, max_size=3).map(tuple))

quotas = st.builds(Quota, org=text, team=text, guaranteed_milli=i64, limit_milli=i64, borrowing=st.booleans(),
                   lending_limit_milli=i64, weight=f64)
team_policies = st.builds(TeamPolicy, team=text, weight=f64, priority_classes=words, pools=words)
pending_reasons = st.builds(PendingReason, kind=st.sampled_from(PendingKind), summary=text, nodes=i32,
                            counts=st.lists(st.builds(NodeCount, filter=text, nodes=i32), max_size=3).map(tuple))


GENERATED: dict[type, set[str]] = {}   # fields each strategy below fills in


def _event(cls, **fields):
    GENERATED[cls] = {"event_id", "time", "producer", *fields}
    return st.builds(cls, event_id=ids, time=f64, producer=text, **fields)


EVENTS = {
    ev.NodeRegistered: _event(ev.NodeRegistered, node=node_infos),
    ev.NodeLost: _event(ev.NodeLost, node=text, reason=text),
    ev.NodeCordoned: _event(ev.NodeCordoned, node=text, reason=text, principal=text),
    ev.NodeUncordoned: _event(ev.NodeUncordoned, node=text, principal=text),
    ev.GpuHealthChanged: _event(ev.GpuHealthChanged, node=text, gpu_index=i32, healthy=st.booleans(),
                                reason=text, xid=i32),
    ev.JobSubmitted: _event(ev.JobSubmitted, job_id=text, spec=job_specs, idempotency_key=text, principal=text),
    ev.JobCancelled: _event(ev.JobCancelled, job_id=text, reason=text, principal=text),
    ev.JobPlaced: _event(ev.JobPlaced, job_id=text, attempt=i32,
                         workers=st.lists(assignments, max_size=3).map(tuple), policy=text),
    ev.WorkerStarted: _event(ev.WorkerStarted, job_id=text, attempt=i32, worker=i32, node=text),
    ev.WorkerFinished: _event(ev.WorkerFinished, job_id=text, attempt=i32, worker=i32, node=text,
                              exit_code=i32, reason=text, signal=i32, oom_killed=st.booleans()),
    ev.CheckpointSaved: _event(ev.CheckpointSaved, job_id=text, attempt=i32, checkpoint=text, progress_s=f64),
    ev.JobPreempted: _event(ev.JobPreempted, job_id=text, attempt=i32, for_job=text, reason=text,
                            planned_nodes=words),
    ev.AttemptFailed: _event(ev.AttemptFailed, job_id=text, attempt=i32, reason=text, charge=st.booleans()),
    ev.JobRetentionSet: _event(ev.JobRetentionSet, job_retention_s=f64),
    ev.NodeFenced: _event(ev.NodeFenced, node=text),
    ev.RendezvousSet: _event(ev.RendezvousSet, job_id=text, attempt=i32, node=text, address=text, port=i32),
    ev.AttemptTimedOut: _event(ev.AttemptTimedOut, job_id=text, attempt=i32, reason=text),
    ev.PoolTimeLimitsSet: _event(ev.PoolTimeLimitsSet, pool=text, default_s=f64, max_s=f64, principal=text),
    ev.PoolTopologySet: _event(ev.PoolTopologySet, pool=text, levels=words, principal=text),
    ev.QuotaSet: _event(ev.QuotaSet, quota=quotas, principal=text),
    ev.TeamPolicySet: _event(ev.TeamPolicySet, policy=team_policies, principal=text),
    ev.PoolCreated: _event(ev.PoolCreated, pool=text, principal=text),
    ev.JobPendingReason: _event(ev.JobPendingReason, job_id=text, attempt=i32, reason=pending_reasons),
    ev.ServiceApplied: _event(ev.ServiceApplied, spec=service_specs, principal=text),
    ev.ServiceScaled: _event(ev.ServiceScaled, service=text, replicas=i32, reason=text, principal=text),
    ev.ServiceDeleted: _event(ev.ServiceDeleted, service=text, principal=text),
    ev.ReplicaReadiness: _event(ev.ReplicaReadiness, job_id=text, attempt=i32, ready=st.booleans(), address=text,
                                port=i32, reason=text),
}
any_event = st.one_of(*EVENTS.values())


# --- bad input: DecodeError and nothing else -------------------------------------------
def _env(**kw) -> bytes:
    return events_pb2.EventEnvelope(**kw).SerializeToString()


def _submitted(kind: int) -> bytes:
    env = events_pb2.EventEnvelope(event_id="e1", type="JobSubmitted")
    env.job_submitted.job_id = "j"
    env.job_submitted.spec.kind = kind
    return env.SerializeToString()


BAD = [
    ("empty", b""),
    ("garbage", b"\xff\xff\xff\xff"),
    ("truncated-varint", b"\x08"),
    ("truncated-length", b"\x0a\x05ab"),
    ("invalid-utf8-event-id", b"\x0a\x02\xff\xfe"),
    ("wrong-wire-type", b"\x0d\x00\x00\x00\x00"),           # event_id as fixed32
    ("no-type", _env(event_id="e1", job_cancelled=events_pb2.JobCancelled(job_id="j"))),
    ("unknown-type", _env(event_id="e1", type="JobExploded", job_cancelled=events_pb2.JobCancelled(job_id="j"))),
    ("base-class-type", _env(event_id="e1", type="Event", job_cancelled=events_pb2.JobCancelled(job_id="j"))),
    ("lowercase-type", _env(event_id="e1", type="jobcancelled", job_cancelled=events_pb2.JobCancelled(job_id="j"))),
    ("type-payload-mismatch", _env(event_id="e1", type="JobCancelled", job_placed=events_pb2.JobPlaced(job_id="j"))),
    ("type-without-payload", _env(event_id="e1", type="NodeLost")),
    ("missing-event-id", _env(type="NodeLost", node_lost=events_pb2.NodeLost(node="n1"))),
    ("unspecified-enum", _submitted(types_pb2.JOB_KIND_UNSPECIFIED)),
    ("unknown-enum-number", _submitted(99)),
    ("negative-enum-number", _submitted(-1)),
    ("another-message", events_pb2.Heartbeat(node="n1", pool="p", agent_id="a", time=1.0).SerializeToString()),
    ("deep-unknown-groups", b"\x9b\x06" * 2000 + b"\x9c\x06" * 2000),
]
