"""Test oracle: the reservation sweep as it was before its ends were indexed
(``gpusched.policies.reservation.ends``): every sweep lists the expected end of every job
on the candidate nodes, heapifies them and pops them in time order. Kept only so that
``test_sweep_index`` can check the indexed sweep makes the same reservations; not used by
the scheduler."""
from __future__ import annotations

import heapq
import math
from typing import Mapping, Sequence

from gpusched.core.model import JobPhase, WorkerAssignment
from gpusched.core.state import ClusterState, JobState, NodeState
from gpusched.policies.reservation.backfill import (
    Estimate, Reservation, ReservationHold, _Sweep, _time_limit,
)
from gpusched.policies.reservation.hosts import could_ever_host
from gpusched.policies.statement import Statement


def oracle_reserve(statement: Statement, job: JobState, now: float,
                             booked: Mapping[str, tuple[WorkerAssignment, ...]] = {},
                             estimate: Estimate = _time_limit,
                             earlier: Sequence[tuple[Reservation, float]] = (),
                             ) -> Reservation | None:
    """The earliest slots where every worker of ``job`` fits once running jobs end, or
    None when that never happens (it fits no node, or it waits on jobs of unknown
    runtime). ``booked``: placements made earlier in this cycle, not yet in the log.
    ``earlier``: reservations made before this one, each with when its job is expected
    to end: what they need stays held for them until then (conservative backfill), and
    they must not be held on the statement already (the sweep holds them itself).

    Sweeps the expected ends in time order, releasing each on ``statement`` and offering
    its node another worker, until every worker has a slot: the work is proportional to
    the ends before the shadow time, not to the cluster. The statement is back at its
    checkpoint on return."""
    mark = statement.checkpoint()
    try:
        return _sweep(statement, job, now, booked, estimate, earlier)
    finally:
        statement.rollback(mark)


def _sweep(statement: Statement, job: JobState, now: float, booked: Mapping[str, tuple[WorkerAssignment, ...]],
           estimate: Estimate, earlier: Sequence[tuple[Reservation, float]]) -> Reservation | None:
    state = statement.state
    # Earlier reservations keep what they need until their jobs end: held here, and held
    # again after every release on their nodes, so this job is never given their slots.
    kept = sorted(((end, i, ReservationHold(statement, r)) for i, (r, end) in enumerate(earlier)),
                  key=lambda k: k[:2])
    for _, _, hold in kept:
        hold.apply()
    sweep = _Sweep(job, statement)
    candidates = [node for node in state.nodes.values() if could_ever_host(node, job)]
    hosts = {node.name for node in candidates}
    for node in candidates:
        sweep.offer(node, now)
        if sweep.done:
            return sweep.reservation(now)
    ends = _ends(state, candidates, booked, now, estimate)
    heapq.heapify(ends)
    while ends or kept:
        t = min(ends[0][0] if ends else math.inf, kept[0][0] if kept else math.inf)
        if t == math.inf:
            break
        touched = set()
        while ends and ends[0][0] == t:   # everything ending at t frees at once
            _, _, name, holder, here = heapq.heappop(ends)
            statement.release(holder, here)
            touched.add(name)
        while kept and kept[0][0] <= t:   # an earlier reserved job ends: its hold goes
            hold = kept.pop(0)[2]
            hold.lift()
            touched.update(hold.nodes)
        for _, _, hold in kept:
            if not touched.isdisjoint(hold.nodes):
                hold.lift()
                hold.apply()
        for name in sorted(touched & hosts):
            sweep.offer(state.nodes[name], t)
        if sweep.done:
            return sweep.reservation(t)
    return None


def _ends(state: ClusterState, candidates: list[NodeState], booked: Mapping[str, tuple[WorkerAssignment, ...]],
          now: float, estimate: Estimate) -> list[tuple]:
    """``(end, i, node, holder, its workers there)`` for every job on ``candidates`` that is
    expected to end, ``i`` numbering a node's jobs (ties in time go by node, then by it).
    One pass over every running job of the pool, each sweep: written out flat, as it is
    most of a sweep's cost on a large pool (a single worker's job, the usual one, needs no
    filtering of its workers)."""
    jobs, inf = state.jobs, math.inf
    ends = []
    append = ends.append
    for node in candidates:
        name, i = node.name, 0
        for job_id in node.jobs:
            holder = jobs[job_id]
            workers = booked.get(job_id, holder.workers)
            if len(workers) == 1:
                here = workers if workers[0].node == name else ()
            else:
                here = tuple(w for w in workers if w.node == name)
            if here:
                phase = holder.phase   # expected_end, inlined
                if phase is _PREEMPTING or phase is _STOPPING:
                    end = now
                else:
                    runtime = estimate(holder)
                    start = holder.started_at if phase is _RUNNING else \
                        holder.placed_at if phase is _PLACED else now
                    end = max(now, start + runtime) if runtime > 0 else inf
                if end < inf:
                    append((end, i, name, holder, here))
                i += 1
    return ends


_PREEMPTING, _STOPPING, _RUNNING, _PLACED = JobPhase.PREEMPTING, JobPhase.STOPPING, JobPhase.RUNNING, JobPhase.PLACED


