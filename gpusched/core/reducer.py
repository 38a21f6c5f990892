"""``apply(state, event) -> Outcome``: the one deterministic fold of the pool log.

Every service and the simulator apply events with this function only. It reads no
clock, draws no random number and does no I/O, so replicas that applied the same prefix
hold the same state (``gpusched.core.digest``). Decisions written by schedulers are
proposals: they are checked here, against the state at their position in the log, and
recorded as rejected when no longer valid — which is what makes zombie schedulers,
duplicated messages and racing replicas harmless.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any, NamedTuple

from gpusched.core import events as ev
from gpusched.core.capacity import check_placement, commit, release, settle_ledger
from gpusched.core.model import (
    EXIT_LOST, NO_PENDING_REASON, ArraySpec, AttemptEnd, FailureCause, JobPhase, NodeStatus, PendingKind, RetryAction,
    ServiceSpec,
)
from gpusched.core.policy import DEFAULT_TEAM, allowed, check_quota, check_team_policy
from gpusched.core.retention import note_ended, prune_finished, set_retention
from gpusched.core.state import (
    CHANGES_KEPT, ClusterState, JobState, NodeState, ServiceState, count_pending, gpu_state, set_gpu_info,
)
from gpusched.core.services import Replica, keeps_minimum, plan
from gpusched.core.topology import NO_REQUEST, check_levels, pool_levels
from gpusched.core.validation import (
    check_known_pool, check_pool_name, check_scale, check_service_alone, check_spec_alone, check_topology,
)

# A node with this many GPU faults is cordoned until an operator clears it.
FAULTS_TO_QUARANTINE = 2
RETRY_BACKOFF_BASE_S = 1.0
# Past lease + kill deadline, for a shim's lease poll and the kernel's SIGKILL delivery.
FENCE_MARGIN_S = 1.0
RETRY_BACKOFF_MAX_S = 300.0

_HOLDS_GPUS = tuple(phase for phase in JobPhase if phase.holds_gpus)
# Members bound once: on Python 3.11 every ``JobPhase.X`` goes through
# EnumType.__getattr__ (~0.13 us), and the handlers test phases several times an event.
_PENDING, _PLACED, _RUNNING, _PREEMPTING = JobPhase.PENDING, JobPhase.PLACED, JobPhase.RUNNING, JobPhase.PREEMPTING
_SUCCEEDED, _FAILED, _CANCELLED = JobPhase.SUCCEEDED, JobPhase.FAILED, JobPhase.CANCELLED
_NO_ARRAY = ArraySpec()
_STOPPING, _TIMEOUT = JobPhase.STOPPING, JobPhase.TIMEOUT
_NO_LIMITS = (0.0, 0.0)
_READY, _LOST, _CORDONED = NodeStatus.READY, NodeStatus.LOST, NodeStatus.CORDONED
_NO_KIND = PendingKind.NONE


class Outcome(NamedTuple):
    """What applying one event did. A tuple, not a frozen dataclass: every event yields
    one, and a tuple is built several times faster."""

    accepted: bool
    reason: str = ""
    jobs: tuple[str, ...] = ()     # jobs whose state changed
    duplicate: bool = False


DUPLICATE = Outcome(False, "duplicate event id", duplicate=True)
ACCEPTED = Outcome(True)   # shared: Outcome is immutable
_new_outcome = tuple.__new__


def _changed(job_id: str) -> Outcome:
    """``Outcome(True, jobs=(job_id,))``, the result of most events, without the Python
    ``__new__`` a NamedTuple call goes through."""
    return _new_outcome(Outcome, (True, "", (job_id,), False))


def apply(state: ClusterState, event: ev.Event) -> Outcome:
    if not state.dedupe.admit(event.event_id):
        return DUPLICATE
    state.applied += 1
    time = event.time
    if time > state.clock:
        state.clock = time
        if 0.0 < state.prune_at <= time:   # before the handler: see gpusched.core.retention
            prune_finished(state)
    handler = _HANDLERS.get(type(event)) or _inherited_handler(type(event))
    outcome = handler(event, state)
    if _RELEASED:   # jobs a job's end released or cancelled (dependencies) changed too
        outcome = outcome._replace(jobs=outcome.jobs + tuple(_RELEASED))
        _RELEASED.clear()
    if outcome.accepted:
        state.version += 1
        if outcome.jobs:
            note_changes(state, outcome.jobs)
    else:
        state.rejected += 1
    return outcome


def note_node(state: ClusterState, name: str, registered: bool = False) -> None:
    """Journal a change of node ``name``'s registration, status or GPU health
    (``ClusterState.node_changes``), bounded as ``note_changes``; ``registered``: a
    registration (counted: ``nodes_registered``)."""
    if registered:
        state.nodes_registered += 1
    state.node_changes.append(name)
    state.node_changes_base += _bounded(state.node_changes)


def note_changes(state: ClusterState, jobs: tuple[str, ...]) -> None:
    """Journal the jobs an event changed (``ClusterState.changes``), bounded."""
    state.changes.extend(jobs)
    state.changes_base += _bounded(state.changes)


def _bounded(journal: list[str]) -> int:
    """Drop the older half of ``journal`` once it holds over ``CHANGES_KEPT`` entries (a
    reader that far behind starts over): how many were dropped."""
    if len(journal) <= CHANGES_KEPT:
        return 0
    dropped = len(journal) // 2
    del journal[:dropped]
    return dropped


# One handler per event type, looked up by the event's exact type: a plain dict is
# several times cheaper per event than functools.singledispatch.
# Each handler takes its own event type: Any, since Callable is contravariant in it.
Handler = Callable[[Any, ClusterState], "Outcome"]
_HANDLERS: dict[type, Handler] = {}


def _handles(cls: type[ev.Event]) -> Callable[[Handler], Handler]:
    def register(handler: Handler) -> Handler:
        _HANDLERS[cls] = handler
        return handler
    return register


def _inherited_handler(cls: type) -> Handler:
    """A subclass of an event type is handled as its nearest registered base (as
    singledispatch did); anything else is unknown."""
    return next((_HANDLERS[base] for base in cls.__mro__ if base in _HANDLERS), _unknown)


def _unknown(event: ev.Event, state: ClusterState) -> Outcome:
    return Outcome(False, f"unknown event type {type(event).__name__}")


def _reject(reason: str, job_id: str = "") -> Outcome:
    return Outcome(False, reason, (job_id,) if job_id else ())


# --- nodes --------------------------------------------------------------------------
@_handles(ev.NodeRegistered)
def _node_registered(e: ev.NodeRegistered, state: ClusterState) -> Outcome:
    info = e.node
    old = state.nodes.get(info.name)
    if old is None:
        state.nodes[info.name] = NodeState(info=info, gpus=[gpu_state(g, info.dynamic_mig) for g in info.gpus])
        state.capacity_epoch += 1
        note_node(state, info.name, registered=True)
        state.pools[info.pool] = None
        return ACCEPTED
    if len(old.gpus) != len(info.gpus):
        return _reject(f"node {info.name} re-registered with a different GPU count")
    if old.jobs and info.pool != old.info.pool:
        return _reject(f"node {info.name} cannot move to pool {info.pool} while it runs jobs")
    if info.cpu_milli < old.used_cpu or info.memory_mib < old.used_mem:
        return _reject(f"node {info.name} re-registered with less CPU or memory than is booked on it")
    # A restarted agent: keep allocations (the log still assigns that work here), take
    # the fresh inventory, and bring a lost node back. A cordon survives restarts.
    old.info = info
    note_node(state, info.name, registered=True)
    for gpu, fresh in zip(old.gpus, info.gpus):
        set_gpu_info(gpu, fresh, info.dynamic_mig)
    if old.status is _LOST:
        # The agent came back: it killed what it still ran and reports those ends
        # before it registers (services/node-agent), so the node is usable again.
        old.status = _CORDONED if old.cordoned else _READY
        old.fence_at = 0.0
    state.capacity_epoch += 1   # back from lost, or a fresh inventory (labels, MIG mode)
    state.pools[info.pool] = None
    return ACCEPTED


@_handles(ev.NodeLost)
def _node_lost(e: ev.NodeLost, state: ClusterState) -> Outcome:
    """Its jobs' attempts end, but nothing of theirs is released yet: the node's workers
    may still run (a partitioned or frozen agent) until its lease ran out and the kill
    deadline passed (``fence_at``). A node whose agent runs nothing under a lease is
    fenced at once."""
    node = state.nodes.get(e.node)
    if node is None or node.status is _LOST:
        return _reject(f"node {e.node} unknown or already lost")
    node.status = _LOST
    note_node(state, e.node)
    node.fence_at = e.time + node.info.lease_s + node.info.kill_wait_s + FENCE_MARGIN_S
    reason = f"node {e.node} lost"
    moved = [_fail_attempt(state, state.jobs[j], _NODE, 0, reason, e.time) for j in sorted(node.jobs)]
    if node.info.lease_s <= 0:
        moved += _fence(state, node, e.time)
    return Outcome(True, jobs=tuple(sorted(set(moved))))


@_handles(ev.NodeFenced)
def _node_fenced(e: ev.NodeFenced, state: ClusterState) -> Outcome:
    node = state.nodes.get(e.node)
    if node is None or node.status is not _LOST or not node.jobs:
        return _reject(f"node {e.node} unknown, not lost, or holding no work to fence")
    if e.time < node.fence_at:
        return _reject(f"node {e.node} cannot be fenced before {node.fence_at:.3f} (lease + kill deadline)")
    return Outcome(True, jobs=tuple(_fence(state, node, e.time)))


def _fence(state: ClusterState, node: NodeState, time: float) -> list[str]:
    """Every worker still held on a lost node is gone: count it as ended (lost)."""
    ended = []
    for job_id in sorted(node.jobs):
        job = state.jobs[job_id]
        for w in job.workers:
            if w.node == node.info.name and w.worker not in job.finished:
                job.finished[w.worker] = EXIT_LOST
        _settle_stop(state, job, time)
        ended.append(job_id)
    return ended


@_handles(ev.NodeCordoned)
def _node_cordoned(e: ev.NodeCordoned, state: ClusterState) -> Outcome:
    node = state.nodes.get(e.node)
    if node is None or node.cordoned:
        return _reject(f"node {e.node} unknown or already cordoned")
    node.cordoned = True
    if node.status is _READY:
        node.status = _CORDONED
    note_node(state, e.node)
    return ACCEPTED


@_handles(ev.NodeUncordoned)
def _node_uncordoned(e: ev.NodeUncordoned, state: ClusterState) -> Outcome:
    node = state.nodes.get(e.node)
    if node is None or not node.cordoned:
        return _reject(f"node {e.node} unknown or not cordoned")
    node.cordoned = False
    if node.status is _CORDONED:
        node.status = _READY
    state.capacity_epoch += 1
    note_node(state, e.node)
    node.faults = 0
    for gpu in node.gpus:   # the operator vouches for the repaired hardware
        gpu.healthy = True
    return ACCEPTED


@_handles(ev.GpuHealthChanged)
def _gpu_health_changed(e: ev.GpuHealthChanged, state: ClusterState) -> Outcome:
    node = state.nodes.get(e.node)
    if node is None or not 0 <= e.gpu_index < len(node.gpus):
        return _reject(f"no GPU {e.gpu_index} on node {e.node}")
    gpu = node.gpus[e.gpu_index]
    if gpu.healthy == e.healthy:
        return _reject("health unchanged")
    gpu.healthy = e.healthy
    note_node(state, e.node)
    if e.healthy:
        state.capacity_epoch += 1
        return ACCEPTED
    node.faults += 1
    if node.faults >= FAULTS_TO_QUARANTINE and not node.cordoned:
        node.cordoned = True
        if node.status is _READY:
            node.status = _CORDONED
    hit = [j for j in sorted(node.jobs) if _uses_gpu(state.jobs[j], e.node, e.gpu_index)]
    moved = [_fail_attempt(state, state.jobs[j], _NODE, 0, f"GPU {e.node}/{e.gpu_index} unhealthy", e.time)
             for j in hit]
    return Outcome(True, jobs=tuple(moved))


def _uses_gpu(job: JobState, node: str, index: int) -> bool:
    return any(w.node == node and any(s.index == index for s in w.gpus) for w in job.workers)


# --- jobs ---------------------------------------------------------------------------
@_handles(ev.JobSubmitted)
def _job_submitted(e: ev.JobSubmitted, state: ClusterState) -> Outcome:
    if e.job_id in state.jobs:
        return _reject(f"job {e.job_id} exists", e.job_id)
    key = f"{e.spec.team}/{e.idempotency_key}" if e.idempotency_key else ""
    if key and key in state.idempotency:
        return _reject(f"idempotency key already used by {state.idempotency[key]}", e.job_id)
    # What admission would refuse is refused here too, so a forged or buggy record
    # cannot create an impossible job (negative GPUs, a pool that does not exist).
    errors = check_spec_alone(e.spec)
    if not errors and e.spec.pool not in state.pools and not _pool_has_nodes(state, e.spec.pool):
        errors = check_known_pool(e.spec.pool, state.pools)
    if not errors and e.spec.topology != NO_REQUEST:
        errors = check_topology(e.spec, pool_levels(state.pool_topology, e.spec.pool))
    if errors:
        return _reject("; ".join(map(str, errors)), e.job_id)
    denied = _denied_by_policy(state, e.spec)
    if denied:
        return _reject(denied, e.job_id)
    default_s, max_s = state.pool_limits.get(e.spec.pool, _NO_LIMITS)
    limit = e.spec.max_runtime_s or default_s
    if max_s and limit > max_s:
        return _reject(f"spec.max_runtime_s {limit:g}s is above pool {e.spec.pool}'s time limit of {max_s:g}s",
                       e.job_id)
    unknown = _bad_dependency(state, e.spec)
    if unknown:
        return _reject(unknown, e.job_id)
    job = JobState(e.job_id, e.spec, state.next_seq, e.time, e.idempotency_key, pending_since=e.time,
                   time_limit_s=limit)
    state.next_seq += 1
    state.jobs[e.job_id] = job
    if key:
        state.idempotency[key] = e.job_id
    if e.spec.array.count:
        _create_tasks(state, job, e.time)
    if e.spec.depends_on:
        _wait_for_dependencies(state, job, e.time)
    else:
        _queue(state, job, e.time)
    return _changed(e.job_id)


def _queue(state: ClusterState, job: JobState, time: float) -> None:
    """Nothing holds ``job`` back any more: into the queue, or for an array its first tasks."""
    if job.array_tasks:
        _release_tasks(state, job, time)
        return
    job.pending_since = time
    state.pending[job.job_id] = None
    count_pending(state, job, 1)


def _create_tasks(state: ClusterState, parent: JobState, time: float) -> None:
    spec = replace(parent.spec, array=_NO_ARRAY, depends_on=())
    tasks = []
    for i in range(parent.spec.array.count):
        task_id = f"{parent.job_id}.{i}"
        state.jobs[task_id] = JobState(task_id, spec, state.next_seq, time, pending_since=time,
                                       time_limit_s=parent.time_limit_s, waiting_for=(parent.job_id,),
                                       reason=f"waits for its turn in array {parent.job_id}",
                                       array_of=parent.job_id, array_index=i)
        state.next_seq += 1
        tasks.append(task_id)
    parent.array_tasks = tuple(tasks)


def _release_tasks(state: ClusterState, parent: JobState, time: float) -> None:
    """Queue the array's next tasks, up to ``parallel`` queued or running at once."""
    limit = parent.spec.array.parallel or len(parent.array_tasks)
    while parent.array_running < limit and parent.array_released < len(parent.array_tasks):
        task = state.jobs.get(parent.array_tasks[parent.array_released])
        parent.array_released += 1
        if task is None or task.phase.terminal:   # cancelled while it waited
            continue
        task.waiting_for = ()
        task.reason = ""
        task.pending_since = time
        state.pending[task.job_id] = None
        count_pending(state, task, 1)
        parent.array_running += 1
        _RELEASED.append(task.job_id)


def _array_task_ended(state: ClusterState, task: JobState, time: float) -> None:
    parent = state.jobs.get(task.array_of)
    if parent is None or parent.phase.terminal:
        return
    _RELEASED.append(parent.job_id)
    parent.array_ended += 1
    if task.phase is not _SUCCEEDED:
        parent.array_failed += 1
    if not task.waiting_for:       # it was released
        parent.array_running -= 1
    if parent.array_ended == len(parent.array_tasks):
        if parent.stop_then == "cancelled":
            _end(state, parent, _CANCELLED, parent.reason, time)
        elif parent.array_failed:
            _end(state, parent, _FAILED, f"{parent.array_failed} of {parent.array_ended} tasks did not succeed", time)
        else:
            _end(state, parent, _SUCCEEDED, "", time)
    elif parent.stop_then != "cancelled" and not parent.waiting_for:
        _release_tasks(state, parent, time)


def _cancel(state: ClusterState, job: JobState, reason: str, time: float) -> None:
    """Cancel ``job``; an array's parent ends once each of its tasks is stopped."""
    if not job.array_tasks:
        _begin_stop(state, job, "cancelled", reason, time)
        return
    job.stop_then, job.reason = "cancelled", reason
    for task_id in job.array_tasks:
        task = state.jobs.get(task_id)
        if task is not None and not task.phase.terminal:
            _RELEASED.append(task_id)
            _begin_stop(state, task, "cancelled", reason, time)
    if job.array_ended == len(job.array_tasks) and not job.phase.terminal:   # none was left to stop
        _end(state, job, _CANCELLED, reason, time)


def _bad_dependency(state: ClusterState, spec) -> str:
    """A dependency on a job this log does not hold (another pool's, or none), or on
    another team's: refused, naming it."""
    for i, dep in enumerate(spec.depends_on):
        other = state.jobs.get(dep.job)
        if other is None:
            return f"spec.depends_on[{i}].job: no job {dep.job!r} in pool {spec.pool}"
        if other.spec.team != spec.team:
            return f"spec.depends_on[{i}].job: job {dep.job!r} belongs to another team"
    return ""


def _wait_for_dependencies(state: ClusterState, job: JobState, time: float) -> None:
    """A new job with dependencies: those already met are done with, one that can never be
    met ends the job at once, the others are waited for (``dependents``)."""
    waiting = []
    for dep in job.spec.depends_on:
        other = state.jobs[dep.job]
        if not other.phase.terminal:
            waiting.append(dep.job)
        elif not dep.met_by(other.phase):
            _cancel(state, job, _never_met(dep, other), time)
            return
    if not waiting:
        _queue(state, job, time)
        return
    job.waiting_for = tuple(waiting)
    job.reason = f"waits for job {waiting[0]}" + (f" and {len(waiting) - 1} more" if len(waiting) > 1 else "")
    for dep_id in waiting:
        state.dependents[dep_id] = state.dependents.get(dep_id, ()) + (job.job_id,)


def _never_met(dep, other: JobState) -> str:
    return f"dependency never met: job {dep.job} ended {other.phase.value}, not {dep.when.value}"


# Jobs released or cancelled by the end of a job they waited for, within one event's
# handler: ``apply`` adds them to its outcome and empties this.
_RELEASED: list[str] = []


def _dependency_ended(state: ClusterState, ended: JobState, time: float) -> None:
    """``ended`` reached its end: each job waiting for it is released (placed once nothing
    else holds it back) or, where its condition can now never be met, cancelled."""
    for job_id in state.dependents.pop(ended.job_id, ()):
        job = state.jobs.get(job_id)
        if job is None or job.phase.terminal or ended.job_id not in job.waiting_for:
            continue
        dep = next(d for d in job.spec.depends_on if d.job == ended.job_id)
        _RELEASED.append(job_id)
        if not dep.met_by(ended.phase):
            job.waiting_for = ()
            _cancel(state, job, _never_met(dep, ended), time)
            continue
        job.waiting_for = tuple(j for j in job.waiting_for if j != ended.job_id)
        if not job.waiting_for:
            job.reason = ""
            _queue(state, job, time)


def _denied_by_policy(state: ClusterState, spec) -> str:
    """Admission checks a team's allow-lists at submit; the fold checks them again at the
    record's position, so a record written around admission cannot use them either."""
    policies = state.team_policies
    if not policies:
        return ""
    field = allowed(policies.get(spec.team) or policies.get(DEFAULT_TEAM), spec.priority_class, spec.pool)
    return f"{field}: team {spec.team} may not use it (team policy)" if field else ""


def _pool_has_nodes(state: ClusterState, pool: str) -> bool:
    """A pool missing from ``state.pools`` while a node is in it: a state restored from
    a snapshot taken before pools were recorded. Recorded now, so this scan runs once."""
    for node in state.nodes.values():
        if node.info.pool == pool:
            state.pools[pool] = None
            return True
    return False


@_handles(ev.JobCancelled)
def _job_cancelled(e: ev.JobCancelled, state: ClusterState) -> Outcome:
    job = state.jobs.get(e.job_id)
    if job is None or job.phase.terminal or job.stop_then == "cancelled":
        return _reject(f"job {e.job_id} unknown or already ended", e.job_id)
    _cancel(state, job, e.reason or "cancelled", e.time)
    return _changed(job.job_id)


@_handles(ev.JobPlaced)
def _job_placed(e: ev.JobPlaced, state: ClusterState) -> Outcome:
    job = state.jobs.get(e.job_id)
    if job is None or job.phase is not _PENDING:
        return _reject(f"job {e.job_id} is not pending", e.job_id)
    if e.attempt != job.attempt:
        return _reject(f"stale attempt {e.attempt}, job is at {job.attempt}", e.job_id)
    if job.waiting_for or job.array_tasks:
        return _reject(f"job {e.job_id} waits for job {job.waiting_for[0]}" if job.waiting_for
                       else f"job {e.job_id} is an array: its tasks are placed", e.job_id)
    problem = check_placement(state, job, e.workers)
    if problem:
        job.reason = f"placement rejected: {problem}"
        return _reject(problem, e.job_id)
    settle_ledger(state, job.team, state.usage.get(job.team) or state.team_usage(job.team))
    commit(state, job, e.workers)
    job.workers = e.workers
    job.phase = _PLACED
    job.placed_at = e.time
    job.reason = ""
    job.rendezvous = ""
    job.pending_reason = NO_PENDING_REASON
    job.started.clear()
    job.finished.clear()
    del state.pending[job.job_id]
    count_pending(state, job, -1)
    state.nominations.pop(job.job_id, None)
    return _changed(job.job_id)


def _current(state: ClusterState, job_id: str, attempt: int) -> JobState | None:
    job = state.jobs.get(job_id)
    if job is None or job.attempt != attempt or job.phase not in _HOLDS_GPUS:
        return None
    return job


@_handles(ev.WorkerStarted)
def _worker_started(e: ev.WorkerStarted, state: ClusterState) -> Outcome:
    job = _current(state, e.job_id, e.attempt)
    if job is None or e.worker in job.started or not _assigned(job, e.worker, e.node):
        return _reject(f"no placed attempt {e.attempt} worker {e.worker} on {e.node}", e.job_id)
    job.started.add(e.worker)
    if job.phase is _PLACED and len(job.started) == job.spec.workers:
        job.phase = _RUNNING
        job.started_at = e.time
    return _changed(job.job_id)


def _assigned(job: JobState, worker: int, node: str) -> bool:
    for w in job.workers:   # a loop, not any(<generator>): this runs for every worker event
        if w.worker == worker and w.node == node:
            return True
    return False


@_handles(ev.WorkerFinished)
def _worker_finished(e: ev.WorkerFinished, state: ClusterState) -> Outcome:
    job = _current(state, e.job_id, e.attempt)
    if job is None or e.worker in job.finished or not _assigned(job, e.worker, e.node):
        return _reject(f"no live attempt {e.attempt} worker {e.worker} on {e.node}", e.job_id)
    job.finished[e.worker] = e.exit_code
    if job.phase is _PREEMPTING or job.phase is _STOPPING:
        _settle_stop(state, job, e.time)
    elif e.exit_code == EXIT_LOST:
        _fail_attempt(state, job, _NODE, 0, e.reason or f"worker {e.worker} lost on {e.node}", e.time)
    elif e.exit_code != 0:
        # One failed member fails the attempt: a gang restarts as a whole, once all of
        # its other members are stopped.
        reason = e.reason or f"worker {e.worker} exited {e.exit_code}"
        if e.oom_killed:
            _fail_attempt(state, job, _OOM, e.exit_code, f"out of memory: {reason}", e.time)
        else:
            _fail_attempt(state, job, _EXIT, e.exit_code, reason, e.time)
    elif len(job.finished) == len(job.workers):
        _end(state, job, _SUCCEEDED, "", e.time)
    return _changed(job.job_id)


@_handles(ev.RendezvousSet)
def _rendezvous_set(e: ev.RendezvousSet, state: ClusterState) -> Outcome:
    job = _current(state, e.job_id, e.attempt)
    if job is None or job.rendezvous or job.phase is _STOPPING or job.phase is _PREEMPTING:
        return _reject(f"no attempt {e.attempt} of {e.job_id} waiting for a rendezvous", e.job_id)
    if not _assigned(job, 0, e.node) or not e.address or not 0 < e.port < 65536:
        return _reject(f"a rendezvous is set by worker 0's node with an address and a port 1..65535", e.job_id)
    job.rendezvous = f"{e.address}:{e.port}"
    return _changed(job.job_id)


@_handles(ev.CheckpointSaved)
def _checkpoint_saved(e: ev.CheckpointSaved, state: ClusterState) -> Outcome:
    job = _current(state, e.job_id, e.attempt)
    if job is None:
        return _reject(f"checkpoint for a job not running attempt {e.attempt}", e.job_id)
    job.checkpoint = e.checkpoint
    job.checkpoint_progress_s = max(job.checkpoint_progress_s, e.progress_s)
    job.checkpoint_at = e.time
    return _changed(job.job_id)


@_handles(ev.JobPreempted)
def _job_preempted(e: ev.JobPreempted, state: ClusterState) -> Outcome:
    job = _current(state, e.job_id, e.attempt)
    if job is None or job.phase is _PREEMPTING or job.phase is _STOPPING:
        return _reject(f"job {e.job_id} attempt {e.attempt} is not running", e.job_id)
    if not job.spec.preemptible:
        return _reject(f"job {e.job_id} is not preemptible", e.job_id)
    if job.spec.service and not keeps_minimum(state, job):
        return _reject(f"job {e.job_id}: service {job.spec.service} would go below its min_replicas", e.job_id)
    job.phase = _PREEMPTING
    job.nominated_by = e.for_job
    job.reason = e.reason or f"preempted for {e.for_job}"
    job.preempted_at, job.preempted_reason = e.time, job.reason
    beneficiary = state.jobs.get(e.for_job)
    if beneficiary is not None and beneficiary.phase is _PENDING:
        known = state.nodes
        if e.planned_nodes and set(e.planned_nodes) <= known.keys():
            # Where the preemptor planned the beneficiary, one node per worker: it may add
            # free capacity beside the victims' nodes. The latest plan replaces any other.
            state.nominations[e.for_job] = (e.planned_nodes, e.time)
        else:   # no plan (an older record), or one naming unknown nodes: the victims' nodes
            nodes, _ = state.nominations.get(e.for_job, ((), 0.0))
            state.nominations[e.for_job] = (tuple(sorted({*nodes, *(w.node for w in job.workers)})), e.time)
    return _changed(job.job_id)


@_handles(ev.AttemptFailed)
def _attempt_failed(e: ev.AttemptFailed, state: ClusterState) -> Outcome:
    job = _current(state, e.job_id, e.attempt)
    if job is None or job.phase is _STOPPING:
        return _reject(f"job {e.job_id} attempt {e.attempt} is not live", e.job_id)
    if e.charge:
        _fail_attempt(state, job, _HANG, 0, e.reason or "attempt failed", e.time)
    else:
        _fail_attempt(state, job, _NODE, 0, e.reason or "attempt lost", e.time)
    return _changed(job.job_id)


@_handles(ev.AttemptTimedOut)
def _attempt_timed_out(e: ev.AttemptTimedOut, state: ClusterState) -> Outcome:
    job = _current(state, e.job_id, e.attempt)
    if job is None or job.stop_then == "timeout" or job.stop_then == "cancelled":
        return _reject(f"job {e.job_id} attempt {e.attempt} is not live", e.job_id)
    _begin_stop(state, job, "timeout", e.reason or f"time limit of {job.time_limit_s:g}s reached", e.time)
    return _changed(job.job_id)


@_handles(ev.JobPendingReason)
def _job_pending_reason(e: ev.JobPendingReason, state: ClusterState) -> Outcome:
    """Only stored, for the API: no decision reads it (docs/guide/why-pending.md)."""
    job = state.jobs.get(e.job_id)
    if job is None or job.phase is not _PENDING or e.attempt != job.attempt:
        return _reject(f"job {e.job_id} attempt {e.attempt} is not pending", e.job_id)
    if e.reason.kind is _NO_KIND:
        return _reject("a pending reason needs a kind", e.job_id)
    job.pending_reason = e.reason
    job.pending_reason_at = e.time
    return _changed(job.job_id)


# --- the log's own settings -----------------------------------------------------------
@_handles(ev.JobRetentionSet)
def _job_retention_set(e: ev.JobRetentionSet, state: ClusterState) -> Outcome:
    seconds = e.job_retention_s
    if not (0.0 <= seconds < float("inf")):   # NaN fails both
        return _reject(f"job retention must be a finite number of seconds >= 0, got {seconds}")
    set_retention(state, seconds)
    return ACCEPTED


@_handles(ev.PoolTimeLimitsSet)
def _pool_time_limits_set(e: ev.PoolTimeLimitsSet, state: ClusterState) -> Outcome:
    default_s, max_s = e.default_s, e.max_s
    if not e.pool:
        return _reject("pool must be named")
    if not (0.0 <= default_s < float("inf")) or not (0.0 <= max_s < float("inf")):
        return _reject("time limits must be finite numbers of seconds >= 0")
    if max_s and default_s > max_s:
        return _reject(f"default time limit {default_s:g}s is above the maximum {max_s:g}s")
    state.pool_limits[e.pool] = (default_s, max_s)
    return ACCEPTED


@_handles(ev.PoolTopologySet)
def _pool_topology_set(e: ev.PoolTopologySet, state: ClusterState) -> Outcome:
    if not e.pool:
        return _reject("pool must be named")
    problem = check_levels(e.levels)
    if problem:
        return _reject(problem)
    if e.levels:
        state.pool_topology[e.pool] = tuple(e.levels)
    else:
        state.pool_topology.pop(e.pool, None)
    state.capacity_epoch += 1   # a parked gang may fit under the new levels
    return ACCEPTED


@_handles(ev.QuotaSet)
def _quota_set(e: ev.QuotaSet, state: ClusterState) -> Outcome:
    q = e.quota
    problem = check_quota(q)
    if problem:
        return _reject(f"quota: {problem}")
    if q.team:
        state.team_quotas[q.team] = q   # a team is in one org: this moves it if it was elsewhere
    else:
        state.org_quotas[q.org] = q
    state.policy_version += 1
    state.capacity_epoch += 1   # a raised limit lets parked jobs fit: offer them again
    return ACCEPTED


@_handles(ev.TeamPolicySet)
def _team_policy_set(e: ev.TeamPolicySet, state: ClusterState) -> Outcome:
    problem = check_team_policy(e.policy)
    if problem:
        return _reject(f"team policy: {problem}")
    state.team_policies[e.policy.team] = e.policy
    state.policy_version += 1
    return ACCEPTED


@_handles(ev.PoolCreated)
def _pool_created(e: ev.PoolCreated, state: ClusterState) -> Outcome:
    errors = check_pool_name(e.pool)
    if errors:
        return _reject(str(errors[0]))
    if e.pool in state.pools:
        return _reject(f"pool {e.pool} exists")
    state.pools[e.pool] = None
    return ACCEPTED


# --- services -----------------------------------------------------------------------
MAX_REVISIONS_KEPT = 10   # templates a service keeps for ``rollout undo``


@_handles(ev.ServiceApplied)
def _service_applied(e: ev.ServiceApplied, state: ClusterState) -> Outcome:
    spec = e.spec
    errors = check_service_alone(spec)
    if not errors and spec.pool not in state.pools and not _pool_has_nodes(state, spec.pool):
        errors = check_known_pool(spec.pool, state.pools)
    if not errors and spec.template.topology != NO_REQUEST:
        errors = check_topology(spec.replica_spec(), pool_levels(state.pool_topology, spec.pool))
    if errors:
        return _reject("; ".join(map(str, errors)))
    denied = _denied_by_policy(state, spec)
    if denied:
        return _reject(denied)
    template = spec.replica_spec()
    service = state.services.get(spec.name)
    if service is None:
        service = state.services[spec.name] = ServiceState(spec, e.time, desired=spec.replicas,
                                                           templates={1: template}, updated_at=e.time,
                                                           rollout_at=e.time, scaled_reason="applied")
    else:
        if service.spec.team != spec.team or service.spec.pool != spec.pool:
            return _reject(f"spec.team, spec.pool: service {spec.name} is team {service.spec.team}'s "
                           f"in pool {service.spec.pool}; delete it to move it")
        if template != service.templates[service.revision]:
            service.revision += 1
            # A template an earlier revision had (a rollback): its replicas are current again.
            for earlier in [r for r, t in service.templates.items() if t == template]:
                del service.templates[earlier]
                for job_id, revision in service.replicas.items():
                    if revision == earlier:
                        service.replicas[job_id] = service.revision
            service.templates[service.revision] = template
            service.rollout_at = e.time
            for old in [r for r in service.templates if r <= service.revision - MAX_REVISIONS_KEPT]:
                del service.templates[old]
        if spec.replicas != service.spec.replicas:
            service.desired, service.scaled_reason = spec.replicas, "applied"
        service.spec = spec
        service.desired = _bounded_count(spec, service.desired)
        service.updated_at = e.time
    _reconcile(state, service, e.time)
    return ACCEPTED


def _bounded_count(spec: ServiceSpec, count: int) -> int:
    count = max(spec.min_replicas, count)
    return min(spec.max_replicas, count) if spec.max_replicas else count


@_handles(ev.ServiceScaled)
def _service_scaled(e: ev.ServiceScaled, state: ClusterState) -> Outcome:
    service = state.services.get(e.service)
    if service is None:
        return _reject(f"no service {e.service}")
    spec = service.spec
    errors = check_scale(spec, e.replicas)
    if errors:
        return _reject("; ".join(map(str, errors)))
    service.desired = e.replicas
    service.scaled_reason = e.reason or "scaled"
    service.updated_at = e.time
    _reconcile(state, service, e.time)
    return ACCEPTED


@_handles(ev.ServiceDeleted)
def _service_deleted(e: ev.ServiceDeleted, state: ClusterState) -> Outcome:
    service = state.services.pop(e.service, None)
    if service is None:
        return _reject(f"no service {e.service}")
    for job_id in service.replicas:
        job = state.jobs.get(job_id)
        if job is not None and not job.phase.terminal:
            _RELEASED.append(job_id)
            _begin_stop(state, job, "cancelled", f"service {e.service} deleted", e.time)
    return ACCEPTED


@_handles(ev.ReplicaReadiness)
def _replica_readiness(e: ev.ReplicaReadiness, state: ClusterState) -> Outcome:
    job = _current(state, e.job_id, e.attempt)
    service = state.services.get(job.spec.service) if job is not None else None
    if (job is None or service is None or e.job_id not in service.replicas
            or (job.phase is not _RUNNING and job.phase is not _PLACED)):
        return _reject(f"replica {e.job_id} attempt {e.attempt} is not a live replica", e.job_id)
    if e.ready:
        service.ready[e.job_id] = f"{e.address}:{e.port}"
        service.crash_loop = 0
    elif service.ready.pop(e.job_id, None) is None:
        return ACCEPTED
    _reconcile(state, service, e.time)
    return _changed(e.job_id)


def _reconcile(state: ClusterState, service: ServiceState, time: float) -> None:
    """Stop and make replicas as ``core.services.plan`` says."""
    replicas = []
    for job_id, revision in service.replicas.items():
        job = state.jobs[job_id]
        load = sum(g.used_milli for w in job.workers if (n := state.nodes.get(w.node)) for g in n.gpus)
        replicas.append(Replica(job_id, revision, job_id in service.ready, bool(job.workers), load, job.seq))
    stop, make = plan(service.desired, service.revision, service.spec.update, replicas)
    for job_id in stop:
        del service.replicas[job_id]
        service.ready.pop(job_id, None)
        _RELEASED.append(job_id)
        _begin_stop(state, state.jobs[job_id], "cancelled", f"service {service.spec.name}: scaled down or replaced",
                    time)
    spec = service.templates[service.revision]
    for _ in range(make):
        job_id = f"{service.spec.name}-{state.next_seq}"
        while job_id in state.jobs:   # a job of that name submitted by hand
            job_id += "x"
        job = JobState(job_id, spec, state.next_seq, time, pending_since=time, time_limit_s=spec.max_runtime_s)
        state.next_seq += 1
        state.jobs[job_id] = job
        service.replicas[job_id] = service.revision
        if service.crash_loop:
            job.not_before = time + replacement_backoff(service.crash_loop)
        _queue(state, job, time)
        _RELEASED.append(job_id)


def replacement_backoff(crash_loop: int) -> float:
    """How long the replacement of a service's ``crash_loop``-th replica in a row to end
    on its own waits before it may be placed: doubling from the retry back-off's base
    to its maximum, as a job's own retries."""
    return min(RETRY_BACKOFF_MAX_S, RETRY_BACKOFF_BASE_S * 2 ** min(crash_loop - 1, 30))


def _replica_not_serving(state: ClusterState, job: JobState, ended: bool, time: float) -> None:
    """A replica's attempt ends (it stops serving: out of the endpoints first) or the
    replica itself ended (replaced)."""
    service = state.services.get(job.spec.service)
    if service is None or job.job_id not in service.replicas:
        return
    service.ready.pop(job.job_id, None)
    if ended:
        del service.replicas[job.job_id]
        service.replaced += 1
        service.crash_loop += 1   # it ended on its own: a scaled-down replica left the list first
        _reconcile(state, service, time)


# --- transitions shared by several events --------------------------------------------
def _end(state: ClusterState, job: JobState, phase: JobPhase, reason: str, time: float) -> None:
    _stop(state, job, time)
    if job.job_id in state.pending:
        del state.pending[job.job_id]
        count_pending(state, job, -1)
    state.nominations.pop(job.job_id, None)
    job.pending_reason = NO_PENDING_REASON
    job.phase = phase
    job.reason = reason
    job.ended_at = time
    job.stop_then = ""
    note_ended(state, job)
    if job.job_id in state.dependents:
        _dependency_ended(state, job, time)
    if job.array_of:
        _array_task_ended(state, job, time)
    if job.spec.service:
        _replica_not_serving(state, job, True, time)


def _stop(state: ClusterState, job: JobState, time: float) -> None:
    if job.phase in _HOLDS_GPUS:
        settle_ledger(state, job.team, state.team_usage(job.team))
        release(state, job, job.workers)
        state.capacity_epoch += 1
        if job.started_at:
            job.run_s += max(0.0, time - job.started_at)


def _requeue(state: ClusterState, job: JobState, reason: str, time: float, charge: int | None = None) -> str:
    """Back to pending as a new attempt; it resumes from ``job.checkpoint`` if any."""
    _stop(state, job, time)
    job.phase = _PENDING
    job.reason = reason
    job.started_at = job.placed_at = 0.0
    job.pending_since = time
    job.attempt += 1
    job.workers = ()
    job.started.clear()
    job.finished.clear()
    job.nominated_by = ""
    job.stop_then = ""
    job.rendezvous = ""
    if job.spec.service:
        _replica_not_serving(state, job, False, time)
    if charge is not None:   # -1: the job's budget; else the retry rule with a budget of its own
        if charge < 0:
            job.restarts += 1
        else:
            job.rule_restarts[charge] = job.rule_restarts.get(charge, 0) + 1
        counted = job.restarts + sum(job.rule_restarts.values())
        backoff = min(RETRY_BACKOFF_MAX_S, RETRY_BACKOFF_BASE_S * 2 ** (counted - 1))
        job.not_before = time + backoff
    if job.job_id not in state.pending:
        state.pending[job.job_id] = None
        count_pending(state, job, 1)
    return job.job_id


_EXIT, _OOM, _HANG = FailureCause.EXIT, FailureCause.OOM, FailureCause.HANG
_NODE, _PREEMPTION = FailureCause.NODE, FailureCause.PREEMPTION
_COUNT, _FAIL = RetryAction.COUNT, RetryAction.FAIL


def _after_failure(job: JobState, cause: FailureCause, exit_code: int) -> str:
    """Where an attempt that failed for ``cause`` leads, by the job's retry policy: placed
    again uncounted ("requeue"), counted against the job's budget ("retry") or a rule's
    ("retry:<rule>"), or the end: at once ("fail now") or with a budget spent ("failed")."""
    rule, action = job.spec.retry_rule(cause, exit_code)
    if action is _FAIL:
        return "fail now"
    if action is not _COUNT:
        return "requeue"
    own = job.spec.retry[rule].max_restarts if rule >= 0 else 0
    if own:
        return f"retry:{rule}" if job.rule_restarts.get(rule, 0) < own else "failed"
    return "retry" if job.restarts < job.spec.max_restarts else "failed"


def _fail_attempt(state: ClusterState, job: JobState, cause: FailureCause, exit_code: int, reason: str,
                  time: float) -> str:
    """The live attempt failed for ``cause``: noted in ``job.failures``, then stopped and
    sent where the retry policy says. An attempt already stopping or ended is left be."""
    if job.phase is _STOPPING or job.phase.terminal or job.phase is _PENDING:
        return _begin_stop(state, job, "requeue", reason, time)
    then = _after_failure(job, cause, exit_code)
    if then == "fail now":
        reason = f"{reason} (the retry policy fails the job on {cause.value}"
        reason += f" {exit_code})" if cause is _EXIT else ")"
    job.failures += (AttemptEnd(job.attempt, cause, exit_code if cause is _EXIT or cause is _OOM else 0,
                                _counted(then), reason, time),)
    return _begin_stop(state, job, then, reason, time)


_TERMINAL_AFTER_STOP = {"cancelled": _CANCELLED, "failed": _FAILED, "fail now": _FAILED, "timeout": _TIMEOUT}
_OVERRIDES_STOP = ("cancelled", "timeout")   # what the user or the clock says beats a requeue


def _begin_stop(state: ClusterState, job: JobState, then: str, reason: str, time: float) -> str:
    """End the attempt: a pending job moves on at once; one that holds resources keeps
    them, STOPPING, until every worker's end is reported (``_settle_stop``). A job
    already stopping keeps stopping; a later cancel or time limit wins over a requeue."""
    if job.phase is _PENDING:
        if then in _TERMINAL_AFTER_STOP:
            _end(state, job, _TERMINAL_AFTER_STOP[then], reason, time)
        return job.job_id
    if job.phase is _STOPPING:
        if then in _OVERRIDES_STOP and job.stop_then not in _TERMINAL_AFTER_STOP:
            job.stop_then, job.reason = then, reason
        return job.job_id
    job.phase = _STOPPING
    job.stop_then = then
    job.reason = reason
    if job.spec.service:
        _replica_not_serving(state, job, False, time)
    _settle_stop(state, job, time)
    return job.job_id


def _settle_stop(state: ClusterState, job: JobState, time: float) -> None:
    """Once every worker of a stopping (or preempted) attempt is gone, release its
    resources and move the job on."""
    if len(job.finished) < len(job.workers):
        return
    then, reason = job.stop_then, job.reason
    if job.phase is _PREEMPTING or then == "preempted":
        job.preemptions += 1
        reason = reason if then else f"preempted for {job.nominated_by}"
        if job.spec.retry:   # a policy may count or refuse preemptions; without one they are free
            then = _after_failure(job, _PREEMPTION, 0)
            job.failures += (AttemptEnd(job.attempt, _PREEMPTION, 0, _counted(then), reason, time),)
            if then == "fail now" or then == "failed":
                _end(state, job, _FAILED, f"{reason} (the retry policy fails the job on preemption)"
                     if then == "fail now" else f"restart budget spent: {reason}", time)
                return
            if then != "requeue":
                _requeue(state, job, reason, time, charge=_charged(then))
                return
        else:
            job.failures += (AttemptEnd(job.attempt, _PREEMPTION, 0, False, reason, time),)
        _requeue(state, job, reason, time)
    elif then == "failed":
        _end(state, job, _FAILED, f"restart budget spent: {reason}", time)
    elif then in _TERMINAL_AFTER_STOP:
        _end(state, job, _TERMINAL_AFTER_STOP[then], reason, time)
    elif then.startswith("retry"):
        _requeue(state, job, f"retrying after failure: {reason}", time, charge=_charged(then))
    else:
        _requeue(state, job, reason, time)


def _counted(then: str) -> bool:
    """Whether an ``_after_failure`` verdict charges a budget (a spent one included)."""
    return then.startswith("retry") or then == "failed"


def _charged(then: str) -> int:
    """The budget a "retry" or "retry:<rule>" verdict is charged to (-1: the job's)."""
    return int(then[6:]) if then.startswith("retry:") else -1
