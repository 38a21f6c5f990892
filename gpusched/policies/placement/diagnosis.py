"""Why a pending job is not placed: a ``PendingReason`` as kube-scheduler's "0/12 nodes
are available: 8 Insufficient nvidia.com/gpu, 4 node(s) were cordoned".

Asked after a cycle, of the state as the cycle left it: its decisions booked (they are
not in the log yet), its EASY-backfill reservation held, nominated nodes kept for their
beneficiaries. The checks, in the order the cycle meets them:

1. back-off: a retried job is not offered before ``not_before``;
2. quota: its team or org would go over a limit (``quota.limit_reached``, the rule
   ``within_limits`` asks);
3. the nodes of its pool: each node is counted under the first filter that refuses one
   worker (``gpu_fit.first_failing``: the one fit rule, check by check), then under
   "nominated" (kept for a preemption's beneficiary) or "reserved" (taken by the
   reservation's hold) if only that refuses it. Whether the job fits is then whether
   the nodes left have room for every worker (``topology.node_capacity`` for gangs).

Jobs of one shape (pool, workers, resources) get the same answer from step 3, so it is
computed once per shape (and reservation/nomination situation) in a ``Diagnosis``.
Nothing here decides anything: the reason is only shown (docs/why-pending.md).
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import replace
from typing import Iterable, Mapping

from gpusched.core.model import NodeCount, PendingKind, PendingReason, WorkerResources
from gpusched.core.state import ClusterState, JobState, NodeState
from gpusched.policies.gpu_fit import (
    CORDONED, CPU, GPUS, LOST, MEMORY, MIG, MODEL, POOL, SHARE, first_failing,
)
from gpusched.policies.placement.topology import node_capacity
from gpusched.policies.queueing.quota import QueueTree, limit_reached
from gpusched.policies.reservation.backfill import Reservation, ReservationHold, ends_before
from gpusched.policies.reservation.nomination import live_nominations
from gpusched.policies.statement import Statement, tentative

NOMINATED, RESERVED, FITS = "nominated", "reserved", "fits"
# Filters in the order they are tried (ties in counts are listed in this order).
FILTERS = (POOL, LOST, CORDONED, MODEL, GPUS, SHARE, MIG, CPU, MEMORY, NOMINATED, RESERVED, FITS)
_RANK = {name: i for i, name in enumerate(FILTERS)}


def label(filter_name: str, res: WorkerResources) -> str:
    """What a count of nodes rejected by ``filter_name`` is, in words."""
    if filter_name == MIG:
        return f"no free {res.mig_profile} MIG slice"
    return _LABELS[filter_name]


_LABELS = {
    POOL: "in another pool", LOST: "lost", CORDONED: "cordoned", MODEL: "without an allowed GPU model",
    GPUS: "not enough free GPUs", SHARE: "no GPU with room for the share", CPU: "not enough free CPU",
    MEMORY: "not enough free memory", NOMINATED: "kept for a preemption's beneficiary",
    RESERVED: "held for a backfill reservation", FITS: "with room",
}


class Diagnosis:
    """Pending reasons against one state as a cycle left it. A context manager: on entry
    the cycle's ``decisions`` ((job, workers) pairs) are booked on a statement, on exit
    undone, so the state is as it was."""

    def __init__(self, state: ClusterState, now: float, quotas: QueueTree,
                 reservation: Reservation | None = None,
                 decisions: Iterable[tuple[JobState, tuple]] = ()) -> None:
        self.state, self.now, self.quotas, self.reservation = state, now, quotas, reservation
        self._decisions = list(decisions)
        placed = {job.job_id for job, _ in self._decisions}
        self._nominated = {j: nodes for j, nodes in live_nominations(state, now).items() if j not in placed}
        self._by_shape: dict[tuple, PendingReason] = {}
        self._statement: Statement | None = None
        self._context = None

    def __enter__(self) -> "Diagnosis":
        self._context = tentative(self.state)
        self._statement = self._context.__enter__()
        for job, workers in self._decisions:
            self._statement.book(job, workers)
        return self

    def __exit__(self, *exc) -> None:
        self._statement = None
        self._context.__exit__(*exc)

    def diagnose(self, job: JobState) -> PendingReason:
        if job.not_before > self.now:
            stamp = time.strftime("%H:%M:%S", time.gmtime(job.not_before))
            return PendingReason(PendingKind.BACKOFF, f"retry back-off after {job.restarts} failure(s): "
                                                      f"not offered before {stamp} UTC")
        reservation = self.reservation
        reserved = reservation.job if reservation is not None else None
        over = limit_reached(self.state, self.quotas, job, reserved)
        if over:
            return PendingReason(PendingKind.QUOTA, over + ".")
        held = (reservation is not None and reserved.job_id != job.job_id
                and not ends_before(job, self.now, reservation.shadow_s))
        nominee = job.job_id if job.job_id in self._nominated else ""
        spec = job.spec
        key = (spec.pool, spec.workers, spec.resources, held, nominee)
        found = self._by_shape.get(key)
        if found is None:
            found = self._by_shape[key] = self._nodes(job, held, nominee)
        if reserved is not None and reserved.job_id == job.job_id and found.kind is not PendingKind.QUEUED:
            return replace(found, summary=found.summary + " Capacity is reserved for it (backfill).")
        return found

    def _nodes(self, job: JobState, held: bool, nominee: str) -> PendingReason:
        spec, res = job.spec, job.spec.resources
        nodes = [n for n in self.state.nodes.values() if n.info.pool == spec.pool]
        counts: Counter[str] = Counter()
        free: list[NodeState] = []
        for node in nodes:
            failing = first_failing(node, spec.pool, res)
            if failing:
                counts[failing] += 1
            else:
                free.append(node)
        kept = {n for j, names in self._nominated.items() if j != nominee for n in names}
        open_nodes = [n for n in free if n.name not in kept]
        counts[NOMINATED] = len(free) - len(open_nodes)
        room_all, room_open = _room(free, res, spec.workers), _room(open_nodes, res, spec.workers)
        if held and open_nodes:
            statement = self._statement
            mark = statement.checkpoint()
            ReservationHold(statement, self.reservation).apply()
            left = [n for n in open_nodes if not first_failing(n, spec.pool, res)]
            room = _room(left, res, spec.workers)
            statement.rollback(mark)
        else:
            left, room = open_nodes, room_open
        counts[RESERVED] = len(open_nodes) - len(left)
        return _verdict(job, len(nodes), counts, len(left), (room, room_open, room_all),
                        self.reservation, sorted(j for j in self._nominated if j != nominee))


def _room(nodes: list[NodeState], res: WorkerResources, workers: int) -> int:
    """How many workers these nodes (each passing every filter) take now, at most ``workers``."""
    if workers == 1:
        return min(1, len(nodes))
    return min(workers, sum(node_capacity(n, res, workers) for n in nodes))


def _verdict(job: JobState, total: int, counts: Counter, fitting: int, rooms: tuple[int, int, int],
             reservation: Reservation | None, nominees: list[str]) -> PendingReason:
    workers = job.spec.workers
    room, room_without_reservation, room_without_holds = rooms
    if fitting:
        counts[FITS] = fitting
    listed = tuple(NodeCount(f, n) for f, n in sorted(counts.items(), key=lambda c: (-c[1], _RANK[c[0]])) if n)
    parts = ", ".join(f"{c.nodes} {label(c.filter, job.spec.resources)}" for c in listed if c.filter != FITS)
    if total == 0:
        return PendingReason(PendingKind.NO_FIT, f"pool {job.spec.pool} has no nodes.", 0, ())
    if room >= workers:
        return PendingReason(PendingKind.QUEUED, f"fits on {fitting}/{total} nodes; waits for its turn in a cycle.",
                             total, listed)
    available = f"{fitting}/{total} nodes are available" + (f": {parts}." if parts else ".")
    if room_without_reservation >= workers and reservation is not None:
        return PendingReason(PendingKind.RESERVATION, f"fits, but job {reservation.job.job_id} holds a backfill "
                                                      f"reservation; {available}", total, listed)
    if room_without_holds >= workers:
        return PendingReason(PendingKind.NOMINATION, f"fits, but nodes freed by preemption are kept for "
                                                     f"{', '.join(nominees)}; {available}", total, listed)
    if workers > 1 and room_without_holds:
        return PendingReason(PendingKind.GANG, f"gang of {workers} workers, room for {room} now; {available}",
                             total, listed)
    return PendingReason(PendingKind.NO_FIT, available, total, listed)


def diagnose(state: ClusterState, job: JobState, now: float, quotas: QueueTree = QueueTree(),
             reservation: Reservation | None = None,
             decisions: Iterable[tuple[JobState, tuple]] = ()) -> PendingReason:
    """One job's pending reason (a ``Diagnosis`` for one question)."""
    with Diagnosis(state, now, quotas, reservation, decisions) as diagnosis:
        return diagnosis.diagnose(job)


def reasons(state: ClusterState, jobs: Iterable[JobState], now: float, quotas: QueueTree,
            reservation: Reservation | None = None,
            decisions: Iterable[tuple[JobState, tuple]] = ()) -> Mapping[str, PendingReason]:
    """Several jobs' pending reasons, against one booking of the cycle's decisions."""
    with Diagnosis(state, now, quotas, reservation, decisions) as diagnosis:
        return {job.job_id: diagnosis.diagnose(job) for job in jobs}
