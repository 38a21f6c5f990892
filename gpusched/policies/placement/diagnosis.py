"""Why a pending job is not placed: a ``PendingReason`` as kube-scheduler's "0/12 nodes
are available: 8 Insufficient nvidia.com/gpu, 4 node(s) were cordoned".

Asked after a cycle, of the state as the cycle left it: its decisions booked (they are
not in the log yet), its EASY-backfill reservations held, nominated nodes kept for their
beneficiaries. What the cycle found out about a job (its ``CycleResult``: why each job
it offered was not placed, the reservations it made, the quotas it ran under) is taken
from it, not worked out again. The checks, in the order the cycle meets them:

1. back-off: a retried job is not offered before ``not_before``;
2. quota: the cycle refused it (``Unplaced.QUOTA``; or, for a job the cycle did not
   reach, ``within_limits`` would): ``quota.limit_reached`` says which limit;
3. the guarantee hold: the cycle refused it as a borrower of what teams waiting below
   their guarantee keep back (``Unplaced.HELD_FOR_GUARANTEE``, ``guarantee_hold``);
4. the nodes of its pool: each node is counted under the first filter that refuses one
   worker (``gpu_fit.first_failing``: the one fit rule, check by check), then under
   "nominated" (kept for a preemption's beneficiary) or "reserved" (taken by the hold of
   a reservation of its pool that it would delay: every such reservation is named, with
   the nodes it takes) if only that refuses it. Whether the job fits is then whether
   the nodes left have room for every worker (``topology.node_capacity`` for gangs).

Jobs of one shape (pool, workers, resources) get the same answer from step 3, so it is
computed once per shape (and reservation/nomination situation) in a ``Diagnosis``.

Step 4 need not call ``first_failing`` on every node of the pool. A ``Diagnosis`` lends
the placement indexes of its memory (``CycleMemory.indexes``, as a cycle's; ``kept_index``)
to its statement, and reads the free-capacity index (``FreeIndex``): a
node outside the index's buckets with room for a worker's whole GPUs or share, and not
lost, cordoned or of a model refused, fails at "gpus" or "share", so only the nodes in
those buckets are checked. On a full pool that is a handful of nodes instead of
thousands; the counts are those of the scan (``scan``: every node checked, the tests'
reference, ``tests/unit/placer/test_reasons_kept.py``).
Nothing here decides anything: the reason is only shown (docs/guide/why-pending.md).
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import replace
from typing import Iterable, Mapping

from gpusched.core.model import NodeCount, NodeStatus, PendingKind, PendingReason, WorkerResources
from gpusched.core.state import ClusterState, JobState, NodeState
from gpusched.policies.memory import CycleMemory
from gpusched.policies.gpu_fit import (
    CORDONED, CPU, GPUS, LOST, MEMORY, MIG, MODEL, POOL, SHARE, first_failing,
)
from gpusched.policies.placement.heuristics import free_index
from gpusched.policies.placement.index import SHARE_STEP, FreeIndex
from gpusched.core.topology import NO_REQUEST, domain_path, pool_levels
from gpusched.policies.placement.topology import DomainTree, node_capacity
from gpusched.policies.queueing.quota import QueueTree, limit_reached
from gpusched.policies.reservation.backfill import (
    DEFAULT_ESTIMATE_S, Reservation, ReservationHold, ends_before, runtime_estimate,
)
from gpusched.policies.reservation.nomination import live_nominations
from gpusched.policies.scheduler import CycleResult, Unplaced
from gpusched.policies.statement import Statement, tentative

NOMINATED, RESERVED, FITS = "nominated", "reserved", "fits"
# Filters in the order they are tried (ties in counts are listed in this order).
FILTERS = (POOL, LOST, CORDONED, MODEL, GPUS, SHARE, MIG, CPU, MEMORY, NOMINATED, RESERVED, FITS)
_RANK = {name: i for i, name in enumerate(FILTERS)}
# The cycle's verdicts that do not say the job is within its quotas: over them, or not
# offered this cycle (not reached, parked, skipped for its shape), so not checked.
_QUOTA_UNJUDGED = (None, Unplaced.QUOTA, Unplaced.PARKED, Unplaced.SKIPPED_SAME_SHAPE)


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
    undone, so the state is as it was. ``cycle``: that cycle's result (None: no cycle
    ran, as in a test of one question); ``default_estimate_s``: the scheduler's, so a job
    is judged to delay a reservation exactly as the cycle judged it."""

    def __init__(self, state: ClusterState, now: float, memory: CycleMemory, quotas: QueueTree,
                 cycle: CycleResult | None = None, decisions: Iterable[tuple[JobState, tuple]] = (),
                 default_estimate_s: float = DEFAULT_ESTIMATE_S, scan: bool = False) -> None:
        memory.refresh(state)
        self.state, self.now, self.quotas, self.memory = state, now, quotas, memory
        self._scan = scan   # every node checked for every shape, the index not read
        self.reservations: tuple[Reservation, ...] = cycle.reservations if cycle is not None else ()
        self._verdict = _verdicts(cycle) if cycle is not None else (lambda job_id: None)
        self._estimate = runtime_estimate(state, default_estimate_s)
        self._decisions = list(decisions)
        placed = {job.job_id for job, _ in self._decisions}
        self._nominated = {j: nodes for j, nodes in live_nominations(state, now).items() if j not in placed}
        self._by_shape: dict[tuple, PendingReason] = {}
        # The pool's nodes of each shape asked so far (what a scan of every node checks):
        # what a caller with a budget reads between questions. Counted alike with or without
        # the kept index, so a budgeted caller reaches the same jobs either way.
        self.node_checks = 0
        self._pools: dict[str, tuple[int, Counter, Counter]] = {}
        self._statement: Statement | None = None
        self._context = None

    def __enter__(self) -> "Diagnosis":
        self._context = tentative(self.state)
        self._statement = self._context.__enter__()
        self.memory.indexes.install(self.state, self._statement)   # before any booking: the log's state
        for job, workers in self._decisions:
            self._statement.book(job, workers)
        return self

    def __exit__(self, *exc) -> None:
        self._statement = None
        self._context.__exit__(*exc)

    def diagnose(self, job: JobState) -> PendingReason:
        if job.not_before > self.now:
            stamp = time.strftime("%H:%M:%S", time.gmtime(job.not_before))
            service = self.state.services.get(job.spec.service) if job.spec.service else None
            if service is not None and not job.restarts and service.crash_loop:
                return PendingReason(PendingKind.BACKOFF, f"service {service.spec.name}: {service.crash_loop} "
                                                          f"replica(s) in a row ended on their own (crash loop): "
                                                          f"this replacement is not offered before {stamp} UTC")
            return PendingReason(PendingKind.BACKOFF, f"retry back-off after {job.restarts} failure(s): "
                                                      f"not offered before {stamp} UTC")
        verdict = self._verdict(job.job_id)
        if verdict in _QUOTA_UNJUDGED:
            first = self.reservations[0].job if self.reservations else None   # as the cycle's quota check
            over = limit_reached(self.state, self.quotas, job, first)
            if over or verdict is Unplaced.QUOTA:
                return PendingReason(PendingKind.QUOTA, (over or f"team {job.team} is at a quota limit") + ".")
        pool = [r for r in self.reservations if r.job.spec.pool == job.spec.pool]
        own = next((r for r in pool if r.job.job_id == job.job_id), None)
        others = tuple(r for r in pool if r is not own)
        # The cycle lifts every hold of the pool for a job gone before each reservation
        # starts, and holds them all otherwise (``ReservationRun.spares``).
        spared = all(ends_before(job, self.now, r.shadow_s, self._estimate) for r in others)
        blocking = () if spared else others
        nominee = job.job_id if job.job_id in self._nominated else ""
        spec = job.spec
        key = (spec.pool, spec.workers, spec.resources, spec.topology, tuple(r.job.job_id for r in blocking), nominee)
        found = self._by_shape.get(key)
        if found is None:
            found = self._by_shape[key] = self._nodes(job, blocking, nominee)
        if verdict is Unplaced.HELD_FOR_GUARANTEE:
            found = _guarantee(job, found)
        if own is not None and found.kind is not PendingKind.QUEUED:
            return replace(found, summary=found.summary + " Capacity is reserved for it (backfill).")
        return found

    def _nodes(self, job: JobState, blocking: tuple[Reservation, ...], nominee: str) -> PendingReason:
        spec, res = job.spec, job.spec.resources
        if not self._scan and not res.is_mig and (res.gpus or res.is_share):
            total, counts, free = self._indexed(spec.pool, res)
        else:
            total, counts, free = self._scanned(spec.pool, res)
        self.node_checks += total
        kept = {n for j, names in self._nominated.items() if j != nominee for n in names}
        open_nodes = [n for n in free if n.name not in kept]
        counts[NOMINATED] = len(free) - len(open_nodes)
        room_all, room_open = _room(free, res, spec.workers), _room(open_nodes, res, spec.workers)
        left, room, taken = self._held(job, open_nodes, blocking, room_open)
        counts[RESERVED] = len(open_nodes) - len(left)
        if spec.workers > 1 and spec.topology != NO_REQUEST and room >= spec.workers:
            topology = _topology(job, left, pool_levels(self.state.pool_topology, spec.pool))
            if topology:
                return PendingReason(PendingKind.TOPOLOGY, f"{topology}; {len(left)}/{total} nodes have room.",
                                     total, tuple(NodeCount(f, n) for f, n in counts.items() if n))
        return _verdict(job, total, counts, len(left), (room, room_open, room_all), taken,
                        sorted(j for j in self._nominated if j != nominee))

    def _scanned(self, pool: str, res: WorkerResources) -> tuple[int, Counter, list[NodeState]]:
        """Every node of ``pool``: its count, the nodes refused by each filter, those that pass."""
        nodes = [n for n in self.state.nodes.values() if n.info.pool == pool]
        counts: Counter[str] = Counter()
        free: list[NodeState] = []
        for node in nodes:
            failing = first_failing(node, pool, res)
            if failing:
                counts[failing] += 1
            else:
                free.append(node)
        return len(nodes), counts, free

    def _indexed(self, pool: str, res: WorkerResources) -> tuple[int, Counter, list[NodeState]]:
        """What ``_scanned`` finds, from the kept index: ``first_failing`` only on the nodes
        of the buckets that may take a worker; every other schedulable node of a model the
        request allows fails at the GPU check (free whole GPUs, or the largest free share)."""
        index = free_index(self._statement, self.state, pool)   # type: ignore[arg-type]
        total, down, models = self._pool(pool, index)
        counts: Counter[str] = Counter(down)
        allowed = 0
        for model, n in models.items():
            if res.allows(model):
                allowed += n
            else:
                counts[MODEL] += n
        if res.is_share:
            need, buckets, check = res.gpu_milli // SHARE_STEP, index.share, SHARE
        else:
            need, buckets, check = res.gpus, index.whole, GPUS
        nodes, free = index.nodes, []
        candidates = 0
        for (model, level), bucket in buckets.items():
            if level >= need and bucket and res.allows(model):
                candidates += len(bucket)
                for _, _, name in bucket:
                    node = nodes[name]
                    failing = first_failing(node, pool, res)
                    if failing:
                        counts[failing] += 1
                    else:
                        free.append(node)
        counts[check] += allowed - candidates
        return total, counts, free

    def _pool(self, pool: str, index: FreeIndex) -> tuple[int, Counter, Counter]:
        """The pool's node count, its lost and cordoned nodes, its schedulable nodes by
        model: once per diagnosis (its bookings and holds change no node's status)."""
        found = self._pools.get(pool)
        if found is None:
            down: Counter[str] = Counter()
            if len(index.where) < len(index.seq):
                nodes = self.state.nodes
                for name in index.seq:
                    if name not in index.where:
                        down[LOST if nodes[name].status is NodeStatus.LOST else CORDONED] += 1
            models: Counter[str] = Counter()
            for (model, _), bucket in index.whole.items():
                models[model] += len(bucket)
            found = self._pools[pool] = (len(index.seq), down, models)
        return found

    def _held(self, job: JobState, open_nodes: list[NodeState], blocking: tuple[Reservation, ...],
              room: int) -> tuple[list[NodeState], int, list[tuple[str, int]]]:
        """The open nodes left and the room for the job with every blocking reservation's
        hold applied (as the cycle applies them: in the order made), and the job of each
        reservation whose hold took some of that room, with the nodes it took whole; the
        holds are undone."""
        if not blocking or not open_nodes:
            return open_nodes, room, []
        statement, pool, res, workers = self._statement, job.spec.pool, job.spec.resources, job.spec.workers
        mark = statement.checkpoint()
        left, taken = open_nodes, []
        for reservation in blocking:
            ReservationHold(statement, reservation).apply()
            still = [n for n in left if not first_failing(n, pool, res)]
            room_now = _room(still, res, workers)
            if room_now < room or len(still) < len(left):
                taken.append((reservation.job.job_id, len(left) - len(still)))
            left, room = still, room_now
        statement.rollback(mark)
        return left, room, taken


def _verdicts(cycle: CycleResult):
    """``cycle.reason``, with the cycle's skipped jobs (a list, up to ``max_job_test`` long)
    looked up in a set made once, not scanned for every job asked about."""
    offered, parked, skipped = cycle.offered, cycle.parked, set(cycle.skipped)

    def verdict(job_id: str) -> Unplaced | None:
        why = offered.get(job_id)
        if why is None and job_id in skipped:
            return Unplaced.SKIPPED_SAME_SHAPE
        return Unplaced.PARKED if why is None and job_id in parked else why
    return verdict


def _guarantee(job: JobState, found: PendingReason) -> PendingReason:
    """The cycle refused ``job`` as a borrower: its team is at or above its guarantee, and
    placing it would take what teams waiting below theirs keep back."""
    held = f"team {job.team} would borrow GPUs kept back for teams waiting below their guarantee (guarantee hold)"
    if found.kind is PendingKind.QUEUED:
        fits = found.summary.split(";")[0]
        return replace(found, kind=PendingKind.GUARANTEE, summary=f"{fits}, but {held}.")
    return replace(found, kind=PendingKind.GUARANTEE, summary=f"{held}; {found.summary}")


def _room(nodes: list[NodeState], res: WorkerResources, workers: int) -> int:
    """How many workers these nodes (each passing every filter) take now, at most ``workers``."""
    if workers == 1:
        return min(1, len(nodes))
    return min(workers, sum(node_capacity(n, res, workers) for n in nodes))


def _verdict(job: JobState, total: int, counts: Counter, fitting: int, rooms: tuple[int, int, int],
             taken: list[tuple[str, int]], nominees: list[str]) -> PendingReason:
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
    if room_without_reservation >= workers and taken:
        return PendingReason(PendingKind.RESERVATION, f"fits, but {_holders(taken)}; {available}", total, listed)
    if room_without_holds >= workers:
        return PendingReason(PendingKind.NOMINATION, f"fits, but nodes freed by preemption are kept for "
                                                     f"{', '.join(nominees)}; {available}", total, listed)
    if workers > 1 and room_without_holds:
        return PendingReason(PendingKind.GANG, f"gang of {workers} workers, room for {room} now; {available}",
                             total, listed)
    return PendingReason(PendingKind.NO_FIT, available, total, listed)


def _topology(job: JobState, nodes: list[NodeState], levels: tuple[str, ...]) -> str:
    """Why the gang's topology request keeps it off ``nodes``, which take its workers
    together: the level it asks for and the domains that came closest; "" if it fits."""
    spec, t, workers = job.spec, job.spec.topology, job.spec.workers
    caps = {n.name: c for n in nodes if (c := node_capacity(n, spec.resources, workers))}
    paths = {name: domain_path(n.info, levels) for n in nodes if (name := n.name) in caps}
    tree = DomainTree(levels, paths, caps, {n.name: n for n in nodes}, t)
    if tree.choose(workers, lambda node: 0) is not None:
        return ""
    for name, level in (("required", t.required), ("slice", t.slice.level)):
        if level and level not in levels:
            return f"its topology {name} level {level!r} is not one of pool {spec.pool}'s levels ({', '.join(levels)})"
    if t.slice.level:
        level, size, depth = t.slice.level, t.slice.workers, levels.index(t.slice.level)
        wanted = f"slices of {size} workers, each inside one {level}"
        need = f"{workers // size} slice" + ("s" if workers > size else "")
    else:
        level, size, depth = t.required, 1, levels.index(t.required)
        wanted, need = f"all {workers} workers inside one {level}", f"{workers} workers"
    room: dict[tuple[str, ...], int] = {}
    for name, path in paths.items():
        room[path[:depth + 1]] = room.get(path[:depth + 1], 0) + caps[name]
    closest = sorted(room.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
    shown = ", ".join(f"{'/'.join(p for p in key if p) or '(unlabelled)'} with room for {c // size}" for key, c in closest)
    unit = "slices" if t.slice.level else "workers"
    return (f"gang of {workers} workers asks for {wanted}: no {level} has room for {need} "
            f"({len(room)} {level}s with room; closest: {shown} {unit})")


def _holders(taken: list[tuple[str, int]]) -> str:
    """Every reservation whose hold takes the job's room, with the nodes it takes."""
    if len(taken) == 1:
        return f"job {taken[0][0]} holds a backfill reservation"
    each = ", ".join(f"job {j}'s" + (f" on {n} node{'s' if n > 1 else ''}" if n else " on part of a node")
                     for j, n in taken)
    return f"{len(taken)} backfill reservations hold its room: {each}"


def diagnose(state: ClusterState, job: JobState, now: float, memory: CycleMemory, quotas: QueueTree = QueueTree(),
             cycle: CycleResult | None = None, decisions: Iterable[tuple[JobState, tuple]] = (),
             default_estimate_s: float = DEFAULT_ESTIMATE_S) -> PendingReason:
    """One job's pending reason (a ``Diagnosis`` for one question)."""
    with Diagnosis(state, now, memory, quotas, cycle, decisions, default_estimate_s) as diagnosis:
        return diagnosis.diagnose(job)


def reasons(state: ClusterState, jobs: Iterable[JobState], now: float, memory: CycleMemory, quotas: QueueTree,
            cycle: CycleResult | None = None, decisions: Iterable[tuple[JobState, tuple]] = (),
            default_estimate_s: float = DEFAULT_ESTIMATE_S, scan: bool = False) -> Mapping[str, PendingReason]:
    """Several jobs' pending reasons, against one booking of the cycle's decisions."""
    with Diagnosis(state, now, memory, quotas, cycle, decisions, default_estimate_s, scan) as diagnosis:
        return {job.job_id: diagnosis.diagnose(job) for job in jobs}
