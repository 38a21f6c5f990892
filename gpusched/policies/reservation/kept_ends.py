"""The index of running jobs' ends (``ends.EndIndex``) kept from one cycle to the next.

Listing every running job's end of a pool is one pass over its running jobs, tens of
thousands on a large pool, and a cycle that reserves paid it every time although between
two cycles only a few jobs start, end or change. ``KeptEnds`` keeps the index for one
pool of one state and, at each cycle's first sweep, brings it in step with the state:

* a node whose set of jobs changed (a job placed there or gone), that is new, or whose
  registration changed (``node.info``), has its ends listed again;
* a job whose end may have moved (its phase, start, time limit or workers changed: it
  started, is being stopped, ended, was requeued) has its nodes listed again;
* a change of what estimates a runtime (the pool's default time limit, the stage's
  default estimate) lists everything again.

Which jobs and nodes to look at the reducer says: it journals the jobs each event changed
(``ClusterState.changes``), so a refresh compares only the jobs journalled since the last
and the nodes they held or hold. A node cordoned, lost or with a GPU's health changed
(``node_changes``) lists no end differently: what it held changes only with a journalled
job; a node registered (added, or its registration new) is compared as the nodes of a
journalled job are. Where a journal was overrun it compares every node and every
running job (a comparison of a few fields, about a tenth of the build). An end is kept
unclamped (``raw_end``: a job being stopped ends at ``-inf``): ``max(now, end)`` keeps
the order, so the walk clamps what it reads (``EndWalk``). Ends that changed are pushed
as new entries and the old ones left in the heap, dead: ``live`` maps each (node, job)
to the number of its one live entry, and the walk skips the others. When the dead
outnumber the live the heap is rebuilt from the live ones.

``tests/unit/policies/reservation/test_kept_ends.py`` holds the kept index against one built afresh
after random changes to the state, and whole cycles with it against cycles without.
"""
from __future__ import annotations

import heapq
import math
from bisect import insort
from typing import AbstractSet, Callable

from gpusched.core.model import JobPhase
from gpusched.core.state import ClusterState, JobState, NodeState
from gpusched.policies.journal_cursor import JournalCursor
from gpusched.policies.reservation.ends import EndIndex

_PREEMPTING, _STOPPING, _RUNNING, _PLACED = JobPhase.PREEMPTING, JobPhase.STOPPING, JobPhase.RUNNING, JobPhase.PLACED


class _Unkeepable(Exception):
    """A job on a node in a phase whose end moves with ``now`` (none in practice): the
    index is built for this cycle alone."""


def raw_end(holder: JobState, estimate: Callable[[JobState], float]) -> float:
    """``ends.end_of`` before it is clamped to ``now``: ``-inf`` for a job being stopped."""
    phase = holder.phase
    if phase is _PREEMPTING or phase is _STOPPING:
        return -math.inf
    runtime = estimate(holder)
    if runtime <= 0:
        return math.inf
    if phase is _RUNNING:
        return holder.started_at + runtime
    if phase is _PLACED:
        return holder.placed_at + runtime
    raise _Unkeepable(holder.job_id)


def _node_order(entry: tuple) -> tuple:
    return entry[1], entry[2]


def _signature(holder: JobState) -> tuple:
    """What a job's end depends on, besides the pool's estimate."""
    return (holder.phase, holder.placed_at, holder.started_at, holder.time_limit_s, holder.workers)


class KeptEnds:
    """One pool's ends, kept for one state between cycles (in ``CycleMemory.ends``)."""

    __slots__ = ("journal", "setting", "index", "nodes", "jobs", "number", "now")

    def __init__(self) -> None:
        # The state kept for, and where its journal was read up to (``_compare_changed``).
        self.journal = JournalCursor()
        self.setting: object = None
        self.index: EndIndex | None = None
        # node -> (its state, its info, its job set, the jobs it has entries for)
        self.nodes: dict[str, tuple[NodeState, object, frozenset[str], tuple[str, ...]]] = {}
        self.jobs: dict[str, tuple[JobState, tuple]] = {}   # job on the pool's nodes -> (state, signature)
        self.number = 0
        self.now = -math.inf   # the latest cycle's: ends before it are overdue

    def current(self, state: ClusterState, pool: str, now: float, estimate, setting: object) -> EndIndex:
        """The index of ``pool``'s ends in ``state``, for this cycle's sweeps.
        ``setting``: what ``estimate`` reads besides the job (compared, not interpreted)."""
        try:
            if state is not self.journal.state or setting != self.setting or self.index is None or now < self.now:
                self._rebuild(state, pool, estimate, setting)
            else:
                self._refresh(state, pool, estimate)
        except _Unkeepable:
            self.journal.forget()
            self.index = None
            return EndIndex(state, pool, now, estimate)
        self.now = now
        self._move_overdue(now)
        index = self.index
        if len(index.heap) + len(index.overdue) > 2 * len(index.live) + 1024:
            self._compact()
        index.numbered = self.number
        return index

    def _move_overdue(self, now: float) -> None:
        """Move the ends at or before ``now`` from the heap to ``overdue``, kept in node
        order: every one of them is read at ``now``, where a sweep reads ends in node
        order, and the heap orders them by their unclamped time. They stay overdue, as
        time only goes on (a cycle at an earlier time rebuilds)."""
        index = self.index
        heap, live, pop = index.heap, index.live, heapq.heappop
        moved = []
        while heap and heap[0][0] <= now:
            entry = pop(heap)
            if live.get((entry[1], entry[3].job_id)) == entry[2]:
                moved.append(entry)
        if len(moved) > 16:   # many at once: one sort beats as many insertions
            index.overdue.extend(moved)
            index.overdue.sort(key=_node_order)
        else:
            for entry in moved:
                insort(index.overdue, entry, key=_node_order)

    def _rebuild(self, state: ClusterState, pool: str, estimate, setting: object) -> None:
        self.journal.start(state)
        self.setting = setting
        index = EndIndex.__new__(EndIndex)
        index.heap, index.live, index.overdue = [], {}, []
        self.index, self.nodes, self.jobs = index, {}, {}
        self._build([node for node in state.nodes.values() if node.info.pool == pool], estimate)
        heapq.heapify(index.heap)

    def _build(self, nodes: list[NodeState], estimate) -> None:
        """``_list`` of every node in ``nodes``, into the heap, with nothing listed yet: a
        job's signature and end worked out once, not once per node of its gang, and a
        single worker's ``here`` taken as is (a build lists ~41,000 jobs at 5,000 nodes).
        Ends as ``raw_end`` gives them, which raises where the index cannot be kept."""
        jobs, live, kept_jobs, kept_nodes = self.journal.state.jobs, self.index.live, self.jobs, self.nodes
        out, inf, number = self.index.heap, math.inf, self.number
        ends: dict[str, float] = {}
        for node in nodes:
            name, members, listed = node.name, frozenset(node.jobs), []
            for job_id in members:
                holder = jobs.get(job_id)
                if holder is None:
                    continue
                workers = holder.workers
                if job_id not in kept_jobs:
                    kept_jobs[job_id] = (holder, (holder.phase, holder.placed_at, holder.started_at,
                                                  holder.time_limit_s, workers))
                if len(workers) == 1:
                    if workers[0].node != name:
                        continue
                    here = workers
                    if holder.phase is _RUNNING:   # ``raw_end``, inlined for the usual case
                        runtime = estimate(holder)
                        end = holder.started_at + runtime if runtime > 0 else inf
                    else:
                        end = raw_end(holder, estimate)
                else:   # a gang: its end once, for its first node
                    here = tuple(w for w in workers if w.node == name)
                    if not here:
                        continue
                    end = ends.get(job_id)
                    if end is None:
                        end = ends[job_id] = raw_end(holder, estimate)
                if end < inf:
                    live[(name, job_id)] = number
                    out.append((end, name, number, holder, here))
                    number += 1
                    listed.append(job_id)
            kept_nodes[name] = (node, node.info, members, tuple(listed))
        self.number = number

    def _refresh(self, state: ClusterState, pool: str, estimate) -> None:
        read = self.journal.read_nodes(state, registered=True)   # None: overrun
        if read is None:
            dirty, changed = self._compare_all(state, pool)
        else:
            dirty, changed = self._compare_changed(state, pool, *read)
        jobs = self.jobs
        for job_id, holder, signature in changed:
            # Listed again with the nodes that hold it now, if any does.
            del jobs[job_id]
            dirty.update(w.node for w in signature[4])
            dirty.update(w.node for w in holder.workers)
        if not dirty:
            return
        nodes = self.nodes
        moved = {job_id for job_id, _, _ in changed}
        live, added = self.index.live, []
        for name in dirty:
            kept = nodes.pop(name, None)
            node = state.nodes.get(name)
            listed = kept[3] if kept is not None else ()
            # An unchanged job still there keeps its entry: only what moved is dead.
            same = {j for j in listed if j not in moved and j in node.jobs} \
                if node is not None and node.info.pool == pool else set()
            for job_id in listed:
                if job_id not in same:
                    del live[(name, job_id)]
            if node is not None and node.info.pool == pool:
                self._list(node, estimate, added, same)
        heap, push, pop = self.index.heap, heapq.heappush, heapq.heappop
        for entry in added:
            push(heap, entry)
        # The jobs that end first are the oldest, those that ended first: their dead
        # entries gather at the top, where every sweep would read past them.
        while heap and live.get((heap[0][1], heap[0][3].job_id)) != heap[0][2]:
            pop(heap)

    def _compare_all(self, state: ClusterState, pool: str) -> tuple[set[str], list[tuple]]:
        """The nodes whose listing is stale and the jobs whose end may have moved, by
        comparing every node and every kept job (when the journal cannot say)."""
        nodes, jobs = self.nodes, self.jobs
        dirty: set[str] = set()
        seen = 0
        for name, node in state.nodes.items():
            kept = nodes.get(name)
            if kept is None:
                if node.info.pool == pool:
                    dirty.add(name)
                continue
            seen += 1
            if kept[0] is not node or kept[1] is not node.info or kept[2] != node.jobs:
                dirty.add(name)
        if seen != len(nodes):   # a node gone from the state
            dirty.update(n for n in nodes if n not in state.nodes)
        # ``_signature``, inlined: this comparison is the whole cost on a quiet pool.
        changed = [(job_id, h, signature) for job_id, (h, signature) in jobs.items()
                   if (h.phase, h.placed_at, h.started_at, h.time_limit_s, h.workers) != signature]
        return dirty, changed

    def _compare_changed(self, state: ClusterState, pool: str, changes: list[str],
                         node_changes: list[str]) -> tuple[set[str], list[tuple]]:
        """``_compare_all`` on what the reducer's journals say changed since the last
        cycle (``ClusterState.changes``, ``node_changes``): a node's jobs change only with
        a job that the journal names, and that held it before (kept) or holds it now; its
        registration only with an entry of its own."""
        nodes, jobs, state_nodes, state_jobs = self.nodes, self.jobs, state.nodes, state.jobs
        dirty: set[str] = set()
        changed = []
        for job_id in dict.fromkeys(changes):
            entry = jobs.get(job_id)
            holder = state_jobs.get(job_id)
            touched = {w.node for w in holder.workers} if holder is not None else set()
            if entry is not None:
                h, signature = entry
                touched.update(w.node for w in signature[4])
                if h is not holder or (h.phase, h.placed_at, h.started_at, h.time_limit_s, h.workers) != signature:
                    changed.append((job_id, h, signature))
            for name in touched:
                kept, node = nodes.get(name), state_nodes.get(name)
                if kept is None:
                    if node is not None and node.info.pool == pool:
                        dirty.add(name)
                elif node is None or kept[0] is not node or kept[1] is not node.info or kept[2] != node.jobs:
                    dirty.add(name)
        for name in dict.fromkeys(node_changes):
            kept, node = nodes.get(name), state_nodes.get(name)
            if node is not None and (node.info.pool == pool if kept is None else kept[1] is not node.info):
                dirty.add(name)
        return dirty, changed

    def _list(self, node: NodeState, estimate, out: list, same: AbstractSet[str] = frozenset()) -> None:
        """Append ``node``'s ends to ``out`` and record them live (as ``EndIndex`` lists
        them), but for the jobs in ``same``, whose live entries stand."""
        jobs, live, name, inf = self.journal.state.jobs, self.index.live, node.name, math.inf
        members = frozenset(node.jobs)
        listed = []
        for job_id in members:
            holder = jobs.get(job_id)
            if holder is None:
                continue
            self.jobs[job_id] = (holder, _signature(holder))
            if job_id in same:
                listed.append(job_id)
                continue
            here = tuple(w for w in holder.workers if w.node == name)
            if not here:
                continue
            end = raw_end(holder, estimate)
            if end < inf:
                live[(name, job_id)] = self.number
                out.append((end, name, self.number, holder, here))
                self.number += 1
                listed.append(job_id)
        self.nodes[name] = (node, node.info, members, tuple(listed))

    def _compact(self) -> None:
        index = self.index
        live = index.live
        index.heap = [e for e in index.heap if live.get((e[1], e[3].job_id)) == e[2]]
        heapq.heapify(index.heap)
        index.overdue = [e for e in index.overdue if live.get((e[1], e[3].job_id)) == e[2]]
