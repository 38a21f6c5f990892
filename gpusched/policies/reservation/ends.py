"""The running jobs' expected ends of a pool, read in time order by every sweep of a cycle.

A reservation sweep (``backfill.reserve_for_head_of_line``) releases running jobs in
the order they are expected to end until the reserved job fits, and usually stops after
the first few ends. On a large pool most of its cost was listing every running job's end
(tens of thousands) to find those few, and a cycle sweeps once per reservation it makes.
So the ends are listed once per cycle and pool, as a binary heap (``EndIndex``), and each
sweep reads that heap in order without consuming it (``EndWalk``: a second, small heap
of the positions whose parents were read), which costs a logarithm per end read and
nothing for the ends after the shadow time. The index is kept from one cycle to the next
in the caller's memory (``CycleMemory.ends``) and only brought in step with what changed
(``kept_ends.KeptEnds``).

Within one cycle an end does not change: it depends on the job's phase and start (only
the log changes those), its estimate and ``now``. What does change between two sweeps of
a cycle is what the cycle booked (``booked``: jobs placed earlier in the cycle, whose
workers are not in the state yet): their ends are read beside the index, each sweep. The
index holds the jobs whose workers are in the state; a waiting job holds none (the
reducer clears them when it requeues), and the cycle books only waiting jobs for good and
releases none, so the two together are every end the sweep would list itself at its start
(``tests/unit/policies/reservation/test_sweep_index.py`` checks that against the sweep that did).
"""
from __future__ import annotations

import heapq
import math
from typing import Mapping

from gpusched.core.model import JobPhase, WorkerAssignment
from gpusched.core.state import ClusterState, JobState

_PREEMPTING, _STOPPING, _RUNNING, _PLACED = JobPhase.PREEMPTING, JobPhase.STOPPING, JobPhase.RUNNING, JobPhase.PLACED

# An end: (time, node, number, job, its workers on that node); numbers are unique, so
# ties never compare jobs. Ends of one time come in node order: a sweep may then release
# and offer node by node (``backfill._release_by_node``) without reading the others.
End = tuple


def end_of(holder: JobState, now: float, estimate) -> float:
    """``backfill.expected_end``, inlined for the index's loop."""
    phase = holder.phase
    if phase is _PREEMPTING or phase is _STOPPING:
        return now
    runtime = estimate(holder)
    if runtime <= 0:
        return math.inf
    start = holder.started_at if phase is _RUNNING else holder.placed_at if phase is _PLACED else now
    return max(now, start + runtime)


class EndIndex:
    """Every finite end of the jobs on ``pool``'s nodes at ``now``, as a heap."""

    __slots__ = ("heap", "live", "numbered", "overdue")

    def __init__(self, state: ClusterState, pool: str, now: float, estimate) -> None:
        # Every entry is live (``live`` None); numbers below ``numbered`` are taken.
        self.live: dict[tuple[str, str], int] | None = None
        # Ends at ``now`` kept apart in node order (``kept_ends``); here they are in the heap.
        self.overdue: list[End] = []
        jobs, inf = state.jobs, math.inf
        heap: list[End] = []
        append = heap.append
        # Written out flat: one pass over every running job of the pool is this index's
        # whole cost (a single worker's job, the usual one, needs no filtering).
        for node in state.nodes.values():
            if node.info.pool != pool:
                continue
            name = node.name
            for job_id in node.jobs:
                holder = jobs[job_id]
                workers = holder.workers
                if len(workers) == 1:
                    here = workers if workers[0].node == name else ()
                else:
                    here = tuple(w for w in workers if w.node == name)
                if here:
                    end = end_of(holder, now, estimate)
                    if end < inf:
                        append((end, name, len(heap), holder, here))
        heapq.heapify(heap)
        self.heap = heap
        self.numbered = len(heap)


class EndWalk:
    """One sweep's ends in time order: the index's merged with the ends of the jobs
    booked in the cycle, on ``hosts`` only."""

    __slots__ = ("index", "frontier", "hosts", "now")

    def __init__(self, index: EndIndex, state: ClusterState, hosts: set[str],
                 booked: Mapping[str, tuple[WorkerAssignment, ...]], now: float, estimate) -> None:
        self.index, self.hosts = index, hosts
        heap = index.heap
        number = index.numbered
        self.now = now
        # (end, node, number, job, workers there, position in the index or -1); an end of
        # the index is clamped to ``now`` here (a kept index holds them unclamped).
        frontier = [(max(now, heap[0][0]), *heap[0][1:], 0)] if heap else []
        # The overdue ends, all at ``now`` and in node order, enter one at a time
        # (position -2 - i in ``index.overdue``), each as the one before is read.
        if index.overdue:
            frontier.append((now, *index.overdue[0][1:], -2))
        jobs = state.jobs
        for job_id, workers in booked.items():
            holder = jobs[job_id]
            for name in sorted({w.node for w in workers} & hosts):
                end = end_of(holder, now, estimate)
                if end < math.inf:
                    here = tuple(w for w in workers if w.node == name)
                    frontier.append((end, name, number, holder, here, -1))
                    number += 1
        heapq.heapify(frontier)
        self.frontier = frontier

    def next_time(self) -> float:
        """When the next end is (``inf``: none left)."""
        frontier = self.frontier
        hosts = self.hosts
        live = self.index.live
        # An end on a node the job cannot use is skipped: releasing there changes nothing it
        # reads; so is an end a kept index has replaced since (``KeptEnds``).
        while frontier and (frontier[0][1] not in hosts or (
                live is not None and frontier[0][5] != -1 and live.get((frontier[0][1], frontier[0][3].job_id))
                != frontier[0][2])):
            self._pop()
        return frontier[0][0] if frontier else math.inf

    def next_node(self) -> str:
        """The node of the next end (``next_time`` said there is one)."""
        return self.frontier[0][1]

    def pop(self) -> tuple[str, JobState, tuple[WorkerAssignment, ...]]:
        """The next end (``next_time`` said there is one): node, job, its workers there."""
        entry = self._pop()
        return entry[1], entry[3], entry[4]

    def _pop(self) -> tuple:
        """Take the frontier's first entry, putting its children in the index in its place."""
        frontier = self.frontier
        entry = heapq.heappop(frontier)
        at = entry[5]
        if at >= 0:
            heap, now = self.index.heap, self.now
            for child in (2 * at + 1, 2 * at + 2):
                if child < len(heap):
                    end = heap[child]
                    heapq.heappush(frontier, (max(now, end[0]), *end[1:], child))
        elif at <= -2:
            overdue, following = self.index.overdue, -at - 1
            if following < len(overdue):
                heapq.heappush(frontier, (self.now, *overdue[following][1:], -2 - following))
        return entry
