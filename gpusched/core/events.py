"""Domain events: the history of one pool log.

Plain frozen dataclasses. ``event_id`` makes replay idempotent; ``time`` is the producer's
wall clock when it decided the event (the reducer reads time only from here, never from
a clock). Serialisation to the protobuf envelope lives in ``gpusched.adapters.codec``.

Events written by schedulers (``JobPlaced``, ``JobPreempted``...) are *proposals*: the
reducer applies them only if they are still valid at their position in the log.
"""
from __future__ import annotations

from dataclasses import dataclass

from gpusched.core.model import JobSpec, NodeInfo, WorkerAssignment


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
class NodeCordoned(Event):
    node: str
    reason: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeUncordoned(Event):
    node: str


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


@dataclass(frozen=True, slots=True, kw_only=True)
class JobCancelled(Event):
    job_id: str
    reason: str = ""


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


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointSaved(Event):
    job_id: str
    attempt: int
    checkpoint: str          # opaque location the workload reported
    progress_s: float = 0.0  # work covered by this checkpoint, seconds of runtime


@dataclass(frozen=True, slots=True, kw_only=True)
class JobPreempted(Event):
    """Proposal: stop these jobs (checkpoint first) so ``for_job`` can run."""

    job_id: str
    attempt: int
    for_job: str = ""
    reason: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptFailed(Event):
    """A supervisor's verdict on an attempt the agents cannot report: hung (no progress
    within its deadline) or lost. Charged to the restart budget when ``charge``."""

    job_id: str
    attempt: int
    reason: str = ""
    charge: bool = True


# --- the log's own settings -----------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class JobRetentionSet(Event):
    """Finished jobs of this log are kept this long (seconds of log time; 0: for ever).
    In the log, not a flag of each service, so every replica folds with the same value."""

    job_retention_s: float


EVENT_TYPES: dict[str, type[Event]] = {
    cls.__name__: cls
    for cls in (
        NodeRegistered, NodeLost, NodeCordoned, NodeUncordoned, GpuHealthChanged,
        JobSubmitted, JobCancelled, JobPlaced, WorkerStarted, WorkerFinished,
        CheckpointSaved, JobPreempted, AttemptFailed, JobRetentionSet,
    )
}
