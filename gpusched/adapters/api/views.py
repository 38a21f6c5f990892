"""State -> API messages (``gpusched.v1``) for the gRPC services."""
from __future__ import annotations

from gpusched.adapters.api.api_time import duration, set_instant
from gpusched.adapters.log.codec import to_proto
from gpusched.core.model import JobPhase, PendingKind
from gpusched.core.queries import PoolSummary, gpus_allocated_milli
from gpusched.core.model import JobSpec
from gpusched.core.state import ClusterState, JobState, NodeState
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


def spec_message(spec: JobSpec) -> types_pb2.JobSpec:
    """The domain spec as the API shows it: spans as Durations, preemptible always set."""
    record = to_proto(spec, types_pb2.JobSpecRecord)
    msg = types_pb2.JobSpec(name=record.name, team=record.team, pool=record.pool,
                            priority_class=record.priority_class, kind=record.kind, workers=record.workers,
                            resources=record.resources, preemptible=record.preemptible, command=record.command,
                            org=record.org, max_restarts=record.max_restarts, max_runtime=duration(spec.max_runtime_s),
                            checkpoint_interval=duration(spec.checkpoint_interval_s),
                            simulated_duration=duration(spec.simulated_duration_s), retry=record.retry,
                            depends_on=record.depends_on, array=record.array)
    return msg


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
        max_time_limit=duration(s.max_time_limit_s),
    )
