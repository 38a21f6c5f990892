"""State -> API messages (``gpusched.v1``) for the gRPC services."""
from __future__ import annotations

from gpusched.adapters.api.api_time import duration, set_instant
from gpusched.adapters.log.codec import to_proto
from gpusched.core.model import JobPhase, PendingKind
from gpusched.core.queries import PoolSummary, gpus_allocated_milli
from gpusched.core.model import JobSpec, Readiness, ServiceSpec
from gpusched.core.services import rollout_done
from gpusched.core.state import ClusterState, JobState, NodeState, ServiceState
from gpusched.core.topology import NO_REQUEST
from gpusched.v1 import cluster_pb2, types_pb2


def job_message(job: JobState) -> types_pb2.Job:
    msg = types_pb2.Job(
        job_id=job.job_id, phase=types_pb2.JobPhase.Value("JOB_PHASE_" + job.phase.name),
        reason=job.reason, attempt=job.attempt,
        restarts=job.restarts, preemptions=job.preemptions, checkpoint=job.checkpoint,
        idempotency_key=job.idempotency_key, time_limit=duration(job.time_limit_s), rendezvous=job.rendezvous,
    )
    for name in ("submitted_at", "placed_at", "started_at", "ended_at"):
        set_instant(getattr(msg, name), getattr(job, name))
    msg.spec.CopyFrom(spec_message(job.spec))
    for w in job.workers:
        msg.workers.append(to_proto(w, types_pb2.WorkerAssignment))
    if job.pending_reason.kind is not PendingKind.NONE:   # docs/guide/why-pending.md
        msg.pending.CopyFrom(to_proto(job.pending_reason, types_pb2.PendingReason))
        msg.pending_at.FromNanoseconds(round(job.pending_reason_at * 1e9))
    if job.array_of:
        msg.array_of, msg.array_index = job.array_of, job.array_index
    if job.array_tasks:
        msg.array.CopyFrom(types_pb2.ArrayProgress(count=len(job.array_tasks), released=job.array_released,
                                                   running=job.array_running, ended=job.array_ended,
                                                   failed=job.array_failed))
        if job.phase is JobPhase.PENDING and job.array_released:
            msg.phase = types_pb2.JOB_PHASE_RUNNING     # under way once its first tasks are queued
    for f in job.failures:
        end = msg.failures.add(attempt=f.attempt, cause=types_pb2.FailureCause.Value(f"FAILURE_CAUSE_{f.cause.name}"),
                               exit_code=f.exit_code, counted=f.counted, reason=f.reason)
        end.time.FromNanoseconds(round(f.time * 1e9))
    return msg


_NO_READINESS = Readiness()


def spec_message(spec: JobSpec) -> types_pb2.JobSpec:
    """The domain spec as the API shows it: spans as Durations, preemptible always set."""
    record = to_proto(spec, types_pb2.JobSpecRecord)
    msg = types_pb2.JobSpec(name=record.name, team=record.team, pool=record.pool,
                            priority_class=record.priority_class, kind=record.kind, workers=record.workers,
                            resources=record.resources, preemptible=record.preemptible, command=record.command,
                            org=record.org, max_restarts=record.max_restarts, max_runtime=duration(spec.max_runtime_s),
                            checkpoint_interval=duration(spec.checkpoint_interval_s),
                            simulated_duration=duration(spec.simulated_duration_s), retry=record.retry,
                            depends_on=record.depends_on, array=record.array, serve_port=record.serve_port)
    if spec.topology != NO_REQUEST:
        msg.topology.CopyFrom(record.topology)
    if spec.readiness != _NO_READINESS:
        r = spec.readiness
        msg.readiness.CopyFrom(types_pb2.ReadinessCheck(
            http_path=r.http_path, command=r.command, period=duration(r.period_s), timeout=duration(r.timeout_s),
            initial_delay=duration(r.initial_delay_s), success_threshold=r.success_threshold,
            failure_threshold=r.failure_threshold))
    return msg


# --- services ---------------------------------------------------------------------------
ROLLOUT_DEADLINE_S = 600.0   # a rollout not done this long after it began is reported stalled


def service_spec_message(spec: ServiceSpec) -> types_pb2.ServiceSpec:
    a = spec.autoscaling
    return types_pb2.ServiceSpec(
        name=spec.name, team=spec.team, pool=spec.pool, priority_class=spec.priority_class,
        preemptible=spec.preemptible, template=spec_message(spec.template), replicas=spec.replicas,
        min_replicas=spec.min_replicas, max_replicas=spec.max_replicas, org=spec.org,
        update=types_pb2.UpdateStrategy(max_surge=spec.update.max_surge, max_unavailable=spec.update.max_unavailable),
        autoscaling=types_pb2.AutoscalingPolicy(
            metric=types_pb2.ScalingMetric.Value("SCALING_METRIC_" + a.metric.name), target=a.target,
            tolerance=a.tolerance, scale_down_window=duration(a.scale_down_window_s), max_scale_up=a.max_scale_up,
            scale_to_zero_after=duration(a.scale_to_zero_after_s)))


def rollout_words(service: ServiceState, now: float) -> str:
    """The rollout's state as ``gpusched rollout status`` says it: "complete", "rolling out
    revision 3: 2 of 4 updated, 3 ready", or "stalled: ..." once ROLLOUT_DEADLINE_S have
    passed since the revision or the count last changed without it completing."""
    if rollout_done(service.desired, service.revision, service.replicas, service.ready):
        return "complete"
    updated = sum(1 for r in service.replicas.values() if r == service.revision)
    progress = f"{updated} of {service.desired} updated, {len(service.ready)} ready"
    if now - max(service.rollout_at, service.updated_at) > ROLLOUT_DEADLINE_S:
        return f"stalled: revision {service.revision} not ready after {ROLLOUT_DEADLINE_S:g}s ({progress})"
    return f"rolling out revision {service.revision}: {progress}"


def service_message(service: ServiceState, state: ClusterState, now: float) -> types_pb2.Service:
    """``service`` of ``state`` (whose jobs are its replicas), its rollout judged at ``now``."""
    msg = types_pb2.Service(
        spec=service_spec_message(service.spec), desired=service.desired, scaled_reason=service.scaled_reason,
        revision=service.revision, replicas=len(service.replicas),
        updated=sum(1 for r in service.replicas.values() if r == service.revision), ready=len(service.ready),
        rollout_done=rollout_done(service.desired, service.revision, service.replicas, service.ready),
        rollout=rollout_words(service, now), replaced=service.replaced, revisions=sorted(service.templates))
    set_instant(msg.created_at, service.created_at)
    set_instant(msg.rollout_at, service.rollout_at)
    for job_id, revision in service.replicas.items():
        job = state.jobs.get(job_id)
        if job is None:
            continue
        pending = job.phase is JobPhase.PENDING and job.pending_reason.kind is not PendingKind.NONE
        msg.replica.append(types_pb2.Replica(
            job_id=job_id, revision=revision, phase=types_pb2.JobPhase.Value("JOB_PHASE_" + job.phase.name),
            ready=job_id in service.ready, endpoint=service.ready.get(job_id, ""),
            nodes=sorted({w.node for w in job.workers}),
            reason=job.pending_reason.summary if pending else job.reason))
    return msg


def endpoints_of(service: ServiceState) -> list[tuple[str, str, int, int]]:
    """(replica, address, port, revision) of each ready replica, in the order made."""
    out = []
    for job_id, revision in service.replicas.items():
        served = service.ready.get(job_id)
        if served is not None:
            address, _, port = served.rpartition(":")
            out.append((job_id, address, int(port) if port.isdigit() else 0, revision))
    return out


def node_message(node: NodeState, state: ClusterState) -> types_pb2.Node:
    """``node`` of ``state`` (whose jobs say what its MIG slices count)."""
    msg = types_pb2.Node(
        status=types_pb2.NodeStatus.Value("NODE_STATUS_" + node.status.name),
        used_cpu_milli=node.used_cpu, used_memory_mib=node.used_mem, jobs=sorted(node.jobs),
    )
    msg.info.CopyFrom(to_proto(node.info, types_pb2.NodeInfo))
    for g, allocated in zip(node.gpus, gpus_allocated_milli(state, node)):
        msg.gpus.append(types_pb2.Gpu(info=to_proto(g.info, types_pb2.GpuInfo), healthy=g.healthy,
                                      used_milli=g.used_milli, mig_slices_used=g.mig_mask,
                                      used_memory_mib=g.used_memory_mib, allocated_milli=allocated))
    return msg


def summary_message(s: PoolSummary) -> cluster_pb2.PoolSummary:
    return cluster_pb2.PoolSummary(
        pool=s.pool, nodes=s.nodes, gpus=s.gpus, gpu_milli_capacity=s.gpu_milli_capacity,
        gpu_milli_allocated=s.gpu_milli_allocated, gpu_milli_free=s.gpu_milli_free,
        pending_jobs=s.pending_jobs, running_jobs=s.running_jobs,
        allocation_ratio=s.allocation_ratio, cpu_milli_capacity=s.cpu_milli_capacity,
        cpu_milli_allocated=s.cpu_milli_allocated, default_time_limit=duration(s.default_time_limit_s),
        max_time_limit=duration(s.max_time_limit_s), topology_levels=s.topology_levels,
    )
