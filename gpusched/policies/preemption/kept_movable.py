"""Defragmentation's movable jobs of a pool (``defrag.MovableEntries``) kept between the
preemptor's rounds, one per pool in the caller's ``CycleMemory.movable``.

Listing them afresh reads every job of every node of the pool. Kept, they follow the
reducer's journal of changed jobs (``JournalCursor``), as the index of candidate victims
does: a journalled job is noted again as it is now (its phase, its last checkpoint, the
nodes it holds). A node journalled by itself (lost, registered, cordoned...), another
state, an overrun journal, other rules or a clock gone back list the pool afresh.

Only a job that may move at some clock is kept (``victim_rules.may_ever_move``, the
clock-free half of ``may_move_now``, which a fresh listing reads). Whether it is movable
now, and the bound it is listed by, depend on the clock too (the other half):

* a job not yet ``movable_from`` (its exempt time) waits in a heap by that time, listed
  once the round's clock reaches it;
* a listed job's bound (``move_bound``, its work at risk) grows with the clock, but the
  order of the listed jobs by when their work began (``work_began``, later first, a job
  never started first) does not: ``entries`` walks that order, computes each bound at
  the round's clock, orders the entries of equal bounds as a fresh listing does (by
  node, then job), and stops at the first job whose work at risk is no longer
  ``move_risk_ok``, as every later one's is not.

So at a round's start ``entries`` are those a fresh ``MovableEntries`` lists
(``tests/unit/policies/preemption/test_kept_placer_views.py``).
"""
from __future__ import annotations

import heapq
import math
from bisect import bisect_left, insort
from typing import Iterable, Iterator, Mapping

from gpusched.core.state import ClusterState, JobState, NodeState
from gpusched.policies.journal_cursor import JournalCursor
from gpusched.policies.preemption.victim_groups import Entry
from gpusched.policies.preemption.victim_rules import may_ever_move, move_bound, move_risk_ok, movable_from, \
    work_began



class KeptMovable:
    """One pool's movable jobs, kept between rounds (see the module doc)."""

    def __init__(self, pool: str) -> None:
        self.pool = pool
        self.journal = JournalCursor()
        self.config: object = None
        self.now = -math.inf
        self._reset()

    def _reset(self) -> None:
        self._nodes: dict[str, tuple[str, ...]] = {}    # job -> the pool's nodes it is on
        self._order: list[tuple[float, int, str]] = []  # (-began, seq, job): listed jobs
        self._key: dict[str, tuple[float, int, str]] = {}   # listed job -> its key in _order
        self._waiting: list[tuple[float, int, str]] = []    # (exempt until, stamp, job)
        self._stamp: dict[str, int] = {}                # waiting job -> its latest stamp
        self._stamps = 0
        self._jobs: dict[str, JobState] = {}            # every job noted

    def refresh(self, state: ClusterState, nodes: Mapping[str, NodeState], now: float, config) -> "KeptMovable":
        """Bring in step with ``state`` at ``now`` under ``config``; ``nodes``: the state's
        nodes as the call sees them (its bookings of pending jobs change no movable job's)."""
        read = self.journal.read_nodes(state)
        if read is None or read[1] or now < self.now or config != self.config:
            self._reset()
            self.config, self.now = config, now
            for name, node in nodes.items():
                if node.info.pool == self.pool:
                    for jid in node.jobs:
                        if jid not in self._jobs:
                            self._note(state.jobs[jid], nodes, bulk=True)
            self._order.sort()   # listed in bulk: sorted once
        else:
            self.now = now
            for jid in dict.fromkeys(read[0]):
                self._forget(jid)
                job = state.jobs.get(jid)
                if job is not None:
                    self._note(job, nodes)
        self._come_due(now)
        return self

    def entries(self, now: float) -> Iterator[Entry]:
        """The movable jobs' entries by bound, as ``MovableEntries`` lists them at ``now``."""
        config = self.config
        run: list[Entry] = []
        for _, _, jid in self._order:
            job = self._jobs[jid]
            if not move_risk_ok(job, now, config):   # type: ignore[arg-type]
                break
            bound = move_bound(job, now)
            if run and run[0][0] != bound:
                run.sort()
                yield from run
                run = []
            run.extend((bound, 1, name, job.seq, job) for name in self._nodes[jid])
        run.sort()
        yield from run

    # --- keeping it in step ---------------------------------------------------------------
    def _note(self, job: JobState, nodes: Mapping[str, NodeState], bulk: bool = False) -> None:
        jid = job.job_id
        self._jobs[jid] = job
        if not may_ever_move(job):
            return
        on = tuple(dict.fromkeys(w.node for w in job.workers if w.node in nodes
                                 and nodes[w.node].info.pool == self.pool and jid in nodes[w.node].jobs))
        if not on:
            return
        self._nodes[jid] = on
        due = movable_from(job, self.config)   # type: ignore[arg-type]
        if self.now >= due:
            self._list(jid, bulk)
        else:
            self._stamps += 1
            self._stamp[jid] = self._stamps
            heapq.heappush(self._waiting, (due, self._stamps, jid))

    def _list(self, jid: str, bulk: bool = False) -> None:
        """List ``jid`` in order (``bulk``: at the end, the caller sorts)."""
        job = self._jobs[jid]
        key = self._key[jid] = (-work_began(job), job.seq, jid)
        if bulk:
            self._order.append(key)
        else:
            insort(self._order, key)

    def _forget(self, jid: str) -> None:
        self._jobs.pop(jid, None)
        self._nodes.pop(jid, None)
        self._stamp.pop(jid, None)
        key = self._key.pop(jid, None)
        if key is not None:
            del self._order[bisect_left(self._order, key)]

    def _come_due(self, now: float) -> None:
        """List the waiting jobs whose exempt time ended by ``now``."""
        waiting = self._waiting
        while waiting and waiting[0][0] <= now:
            _, stamp, jid = heapq.heappop(waiting)
            if self._stamp.get(jid) == stamp:
                del self._stamp[jid]
                self._list(jid)


class KeptEntries:
    """A call's view of a pool's kept movable jobs (``defrag.indexed_search``): the
    scratch's changes never make a job movable (``MovableEntries``). The entries a search
    read are kept for the call's later searches, which read them again from the first."""

    def __init__(self, kept: KeptMovable, now: float) -> None:
        self.read: list[Entry] = []
        self._rest = kept.entries(now)

    def candidates(self) -> Iterator[Entry]:
        read, at = self.read, 0
        while True:
            if at == len(read):
                entry = next(self._rest, None)
                if entry is None:
                    return
                read.append(entry)
            yield read[at]
            at += 1

    def touch(self, names: Iterable[str]) -> None:
        """Nothing to do (see the class doc)."""


def kept_entries(movable: KeptMovable, state: ClusterState, nodes: Mapping[str, NodeState],
                 now: float, config) -> KeptEntries:
    """The pool's movable jobs kept in ``movable``, brought in step with ``state`` at ``now``."""
    return KeptEntries(movable.refresh(state, nodes, now, config), now)
