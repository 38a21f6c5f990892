"""What a service's replicas should become: the one rule of scaling and rolling updates.

The reducer keeps each service's replicas as its state says (``ServiceState``) by asking
``plan`` after every event that may change the answer: the service applied, scaled or
deleted, a replica ready or not, a replica ended. ``plan`` is a pure function of the
desired count, the current revision, the update strategy and the live replicas, so every
replica of the log reaches the same decision, and a rollout or a scale in progress
resumes where the log left it after any service restarts.

Kubernetes' Deployment controller is the model:
- **Steady state** (every replica of the current revision): make the missing ones, stop
  the extra ones.
- **Rolling update** (replicas of older revisions live): at most ``desired + max_surge``
  replicas live, at least ``desired - max_unavailable`` ready. Old replicas that are not
  ready serve nobody and go first; ready old ones go as far as the ready count allows;
  new ones are made up to the surge. A new revision that never gets ready therefore
  stalls the rollout with the old replicas serving.
- **Which replicas go** (``removal_order``): those not placed, then those not ready, then
  those on the emptiest nodes (stopping them frees the most for packing), newest first.
"""
from __future__ import annotations

from typing import Collection, NamedTuple

from gpusched.core.model import JobPhase, UpdateStrategy
from gpusched.core.state import ClusterState, JobState


class Replica(NamedTuple):
    """A live replica as the rule sees it."""

    job_id: str
    revision: int
    ready: bool
    placed: bool
    node_load: int     # GPU milli in use on its nodes (what stopping it leaves behind)
    made: int          # its submission order (``JobState.seq``)


class Plan(NamedTuple):
    stop: tuple[str, ...]   # replicas to stop, in this order
    make: int               # replicas of the current revision to make


def removal_order(replicas: list[Replica]) -> list[Replica]:
    """The order replicas are stopped in when some must go."""
    return sorted(replicas, key=lambda r: (r.placed, r.ready, r.node_load, -r.made))


def plan(desired: int, revision: int, update: UpdateStrategy, replicas: list[Replica]) -> Plan:
    new = [r for r in replicas if r.revision == revision]
    old = [r for r in replicas if r.revision != revision]
    stop: list[Replica] = []
    if len(new) > desired:
        stop += removal_order(new)[:len(new) - desired]
    if not old:
        return Plan(tuple(r.job_id for r in stop), max(0, desired - (len(new) - len(stop))))
    stop += removal_order([r for r in old if not r.ready])
    old_ready = [r for r in old if r.ready]
    ready = sum(r.ready for r in new if r not in stop) + len(old_ready)
    stop += removal_order(old_ready)[:max(0, ready - max(0, desired - update.max_unavailable))]
    most = desired + update.max_surge
    live = [r for r in replicas if r not in stop]
    if len(live) > most:   # scaled down mid-rollout: the least available go, old before new
        extra = sorted(live, key=lambda r: (r.placed, r.ready, r.revision == revision, r.node_load, -r.made))
        stop += extra[:len(live) - most]
    kept_new = sum(1 for r in new if r not in stop)
    make = max(0, min(desired - kept_new, most - (len(replicas) - len(stop))))
    return Plan(tuple(r.job_id for r in stop), make)


def rollout_done(desired: int, revision: int, replicas: dict[str, int], ready: dict[str, str]) -> bool:
    """Every replica is of the current revision, as many as desired, all ready."""
    return (len(replicas) == desired and all(rev == revision for rev in replicas.values())
            and all(job_id in ready for job_id in replicas))


_STOPPING = (JobPhase.PREEMPTING, JobPhase.STOPPING)


def keeps_minimum(state: ClusterState, victim: JobState, taken: Collection[str] = ()) -> bool:
    """Whether preempting ``victim`` (a replica) for other work leaves its service at
    least ``min_replicas`` replicas that are not being stopped, ``taken`` (victims chosen
    beside it) stopped too: preemption never takes a service below its minimum. The
    preemptor's search asks it of each candidate, the reducer of each ``JobPreempted``."""
    service = state.services.get(victim.spec.service)
    if service is None or victim.job_id not in service.replicas:
        return True
    left = 0
    for job_id in service.replicas:
        job = state.jobs.get(job_id)
        if job_id != victim.job_id and job_id not in taken and job is not None and job.phase not in _STOPPING:
            left += 1
    return left >= service.spec.min_replicas
