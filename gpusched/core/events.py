"""Domain events: the history of one pool log.

Plain frozen dataclasses. ``event_id`` makes replay idempotent; ``time`` is the producer's
wall clock when it decided the event (the reducer reads time only from here, never from
a clock). Serialisation to the protobuf envelope lives in ``gpusched.adapters.log.codec``.

Events written by schedulers (``JobPlaced``, ``JobPreempted``...) are *proposals*: the
reducer applies them only if they are still valid at their position in the log.
"""
from __future__ import annotations

from dataclasses import dataclass

from gpusched.core.model import JobSpec, NodeInfo, PendingReason, ServiceSpec, WorkerAssignment
from gpusched.core.policy import Quota, TeamPolicy


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    event_id: str
    time: float = 0.0
    producer: str = ""


# --- nodes --------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class NodeRegistered(Event):
    node: NodeInfo


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeLost(Event):
    node: str
    reason: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeFenced(Event):
    """A lost node's workers are certainly dead: its agent's lease ran out and the kill
    deadline passed (``NodeState.fence_at``). Their resources are released and their
    jobs may run elsewhere. Written by the supervisor, never before ``fence_at``."""

    node: str


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeCordoned(Event):
    node: str
    reason: str = ""
    principal: str = ""    # who asked through the API (audit); "" in the dev mode


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeUncordoned(Event):
    node: str
    principal: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuHealthChanged(Event):
    node: str
    gpu_index: int
    healthy: bool
    reason: str = ""
    xid: int = 0


# --- jobs ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class JobSubmitted(Event):
    job_id: str
    spec: JobSpec
    idempotency_key: str = ""
    principal: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class JobCancelled(Event):
    job_id: str
    reason: str = ""
    principal: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class JobPlaced(Event):
    """Proposal: run attempt ``attempt`` of the job on these workers."""

    job_id: str
    attempt: int
    workers: tuple[WorkerAssignment, ...]
    policy: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerStarted(Event):
    job_id: str
    attempt: int
    worker: int
    node: str


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerFinished(Event):
    job_id: str
    attempt: int
    worker: int
    node: str
    exit_code: int
    reason: str = ""
    signal: int = 0          # the signal that ended the process (SIGKILL after the kill deadline)
    # It ran out of memory (the node-agent's finding): the host's out-of-memory killer
    # ended it, or it failed after its output said a GPU allocation failed.
    oom_killed: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class RendezvousSet(Event):
    """Where the workers of a gang's attempt meet: a free port on worker 0's node,
    chosen by that node's agent. The other workers start once it is in the log."""

    job_id: str
    attempt: int
    node: str
    address: str
    port: int


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointSaved(Event):
    job_id: str
    attempt: int
    checkpoint: str          # opaque location the workload reported
    progress_s: float = 0.0  # work covered by this checkpoint, seconds of runtime


@dataclass(frozen=True, slots=True, kw_only=True)
class JobPreempted(Event):
    """Proposal: stop these jobs (checkpoint first) so ``for_job`` can run.

    ``planned_nodes``: where the preemptor planned ``for_job``, the node of each of its
    workers in worker order (a node repeats when it takes several): the victims' nodes
    and any free capacity the plan adds. Nominated for it; empty in records written
    before the field existed, whose nomination is the victims' nodes (as is that of a
    plan naming a node the log does not know)."""

    job_id: str
    attempt: int
    for_job: str = ""
    reason: str = ""
    planned_nodes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptFailed(Event):
    """A supervisor's verdict on an attempt the agents cannot report: hung (no progress
    within its deadline) or lost. Charged to the restart budget when ``charge``."""

    job_id: str
    attempt: int
    reason: str = ""
    charge: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptTimedOut(Event):
    """The supervisor's verdict on an attempt that reached its time limit: it is
    stopped and the job ends as TIMEOUT (not retried, not charged as a fault)."""

    job_id: str
    attempt: int
    reason: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class JobPendingReason(Event):
    """Why attempt ``attempt`` of a pending job is not placed, as the placer last found
    it (``gpusched.policies.placement.diagnosis``). Written only when the reason changes,
    so every replica answers ``GetJob`` from its own fold; it changes no decision and is
    dropped when the job is placed or ends."""

    job_id: str
    attempt: int
    reason: PendingReason


# --- services -----------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class ServiceApplied(Event):
    """Create ``spec.name`` or change it. A changed template is a new revision, rolled out
    by the service's update strategy; ``spec.replicas`` becomes the desired count when the
    service is new or the spec's count changed (so re-applying a file after an autoscaler
    moved the count keeps the count)."""

    spec: ServiceSpec
    principal: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class ServiceScaled(Event):
    """The service's desired replica count: from ``gpusched scale``, the autoscaler, or a
    request for a service scaled to zero."""

    service: str
    replicas: int
    reason: str = ""
    principal: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class ServiceDeleted(Event):
    """The service goes and its replicas are stopped."""

    service: str
    principal: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaReadiness(Event):
    """A replica's node-agent found attempt ``attempt`` of it ready to serve, or no longer
    ready, by its readiness check; ``address``:``port`` is where it serves."""

    job_id: str
    attempt: int
    ready: bool
    address: str = ""
    port: int = 0
    reason: str = ""


# --- the log's own settings -----------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class PoolTimeLimitsSet(Event):
    """A pool's time limits, as Slurm's partition ``DefaultTime``/``MaxTime``: jobs
    submitted without ``max_runtime_s`` get ``default_s``; none may ask more than
    ``max_s``. 0 means none. Applies to jobs submitted after it."""

    pool: str
    default_s: float = 0.0
    max_s: float = 0.0
    principal: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolTopologySet(Event):
    """A pool's topology levels from the top down, each a node label's key (e.g.
    ``spine``, ``rack``, ``block``; ``gpusched.core.topology``); empty: the default
    levels. Applies from the next scheduling cycle, to pending jobs too."""

    pool: str
    levels: tuple[str, ...] = ()
    principal: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolCreated(Event):
    """An operator made ``pool`` exist before any node registered in it. A pool exists
    once a node registered in it or this was written; jobs for other pools are refused."""

    pool: str
    principal: str = ""      # who created it (audit)


@dataclass(frozen=True, slots=True, kw_only=True)
class JobRetentionSet(Event):
    """Finished jobs of this log are kept this long (seconds of log time; 0: for ever).
    In the log, not a flag of each service, so every replica folds with the same value."""

    job_retention_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class QuotaSet(Event):
    """An org's or a team's quota (``gpusched.core.policy``); replaces the previous one.
    Written to every partition: each log holds the whole cluster policy."""

    quota: Quota
    principal: str = ""      # who set it (audit)


@dataclass(frozen=True, slots=True, kw_only=True)
class TeamPolicySet(Event):
    """A team's fair-share weight and allow-lists; replaces the previous one."""

    policy: TeamPolicy
    principal: str = ""      # who set it (audit)


EVENT_TYPES: dict[str, type[Event]] = {
    cls.__name__: cls
    for cls in (
        NodeRegistered, NodeLost, NodeCordoned, NodeUncordoned, GpuHealthChanged,
        JobSubmitted, JobCancelled, JobPlaced, WorkerStarted, WorkerFinished,
        CheckpointSaved, JobPreempted, AttemptFailed, JobRetentionSet,
        NodeFenced, RendezvousSet, AttemptTimedOut, PoolTimeLimitsSet, PoolTopologySet, PoolCreated,
        QuotaSet, TeamPolicySet, JobPendingReason,
        ServiceApplied, ServiceScaled, ServiceDeleted, ReplicaReadiness,
    )
}
