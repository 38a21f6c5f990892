"""Retention of finished jobs: how the state stays bounded on a log that never ends.

Without it every job ever submitted stays in the state: memory, snapshot size, the time to
restore a snapshot and the cyclic GC's scans all grow with the pool's whole history. As
Slurm's ``MinJobAge`` and Kubernetes' ``ttlSecondsAfterFinished``, a job that reached a
terminal phase (succeeded, failed, cancelled) is dropped ``retention_s`` after it ended.
Its history stays in the log, where audit and billing consumers read it.

Deterministic, so replicas agree: the time that counts is the log's own clock (the
latest event time applied, ``state.clock``), never the wall clock, and jobs go in the
order they ended. The reducer calls ``prune_finished`` when the clock passes
``state.prune_at`` — *before* applying the event that moved it, so a job that ended in
an event is still in the state for whoever handles that event's outcome.

The value is the log's own: a ``JobRetentionSet`` event (admission records its
``--job-retention`` when the log holds another value), so every replica of a pool folds
with the same one and a snapshot carries it. A state starts with retention off.

Dropping a job also frees its idempotency key: a submission reusing the key after the
retention creates a new job (as re-creating a deleted Kubernetes Job of the same name).
"""
from __future__ import annotations

from gpusched.core.state import ClusterState, JobState

# Pruned entries are cut off the front of ``state.ended`` in bulk, not one at a time.
_COMPACT_MIN = 4096


def set_retention(state: ClusterState, retention_s: float) -> None:
    """Apply a ``JobRetentionSet``: from now on, terminal jobs go ``retention_s`` after
    they ended. Jobs that ended while retention was off were not queued: they join the
    queue now, in the order they ended (then of submission), as if it had been on."""
    was = state.retention_s
    state.retention_s = retention_s
    if retention_s <= 0:
        state.ended.clear()
        state.ended_head = 0
        state.prune_at = 0.0
        return
    if was <= 0:
        ended = sorted((j for j in state.jobs.values() if j.phase.terminal), key=lambda j: (j.ended_at, j.seq))
        state.ended[:] = [j.job_id for j in ended]
        state.ended_head = 0
    waiting = _first_waiting(state)
    state.prune_at = waiting.ended_at + retention_s if waiting is not None else 0.0
    # The next event that moves the clock prunes what the new value leaves behind.


def _first_waiting(state: ClusterState) -> JobState | None:
    ended, head = state.ended, state.ended_head
    return state.jobs.get(ended[head]) if head < len(ended) else None


def note_ended(state: ClusterState, job: JobState) -> None:
    """Queue a job that just reached a terminal phase for pruning (if retention is on)."""
    if state.retention_s <= 0:
        return
    state.ended.append(job.job_id)
    if not state.prune_at:
        state.prune_at = job.ended_at + state.retention_s


def prune_finished(state: ClusterState) -> int:
    """Drop the terminal jobs that ended ``retention_s`` or more before ``state.clock``,
    in the order they ended; how many went."""
    horizon = state.clock - state.retention_s
    ended, jobs, head = state.ended, state.jobs, state.ended_head
    dropped = 0
    while head < len(ended):
        job = jobs.get(ended[head])
        if job is not None and job.phase.terminal:
            if job.ended_at > horizon:
                break
            _drop(state, job)
            dropped += 1
        head += 1
    if head >= _COMPACT_MIN and head * 2 >= len(ended):
        del ended[:head]
        head = 0
    state.ended_head = head
    waiting = _first_waiting(state)
    state.prune_at = waiting.ended_at + state.retention_s if waiting is not None else 0.0
    state.pruned += dropped
    return dropped


def _drop(state: ClusterState, job: JobState) -> None:
    del state.jobs[job.job_id]
    if job.idempotency_key:
        key = f"{job.spec.team}/{job.idempotency_key}"
        if state.idempotency.get(key) == job.job_id:
            del state.idempotency[key]
