"""What the policies keep for one partition's state from one cycle to the next:
``CycleMemory``, one object with one typed attribute per structure kept.

A scheduling cycle and a preemptor call each take a memory, required
(``Scheduler.schedule``, ``preemption_decisions``, ``defrag_decisions``, ``victims_for``,
``why_no_victims``, ``Diagnosis``). The placer keeps one per owned partition
(``PoolMemory.policies``), the preemptor one per partition (``PartitionMemory.policies``),
each dropped with its partition; the simulators keep one for their placer and one for
their preemptor; a caller that keeps nothing between calls passes a new one
(``CycleMemory()``), and the call decides as with a kept one
(the property tests of each structure hold a kept one against one built afresh).

The refresh protocol. Every entry point starts with ``refresh(state)``, the one place
that decides whether what is kept was kept for ``state``:

* another state object than the last (a partition taken again is replayed into a new
  state; a test hands another state): every structure is dropped, each built again
  from ``state`` when first asked;
* the same state: each structure is brought in step with what changed since its last
  look, read from the reducer's journals of changed jobs and nodes
  (``ClusterState.changes``, ``ClusterState.node_changes``).

What remains per structure: each reads the journals through its own ``JournalCursor``
(directly, or through ``TouchedNodes``) when it is first used in a cycle, because they
are used at different points of a cycle, some per pool and built lazily: ``indexes``
when the cycle's statement opens, ``hosts`` and ``ends`` at the reservation stage's first
sweep, ``movable`` and ``victims`` at a preemptor call's first search, ``keys``' fair
share queues when the queue is sorted. A cursor still checks that it reads the state it
last read (what ``refresh`` guarantees) and answers None where its journal cannot say
(entries dropped unread; a node registered, for a reader that does not take
registrations): that structure alone starts over from the state. ``indexes`` holds the
placement views by their key in the cycle's ``Statement`` (a free-capacity index per
pool, FGD's mix and scorer...), since the statement tells every view of every node it
changes. Caches checked against their own inputs rather than the state stay inside their
structure (the estimate setting in ``KeptEnds``, the preemption settings in
``KeptMovable`` and ``VictimIndex``, the capacity epoch in ``ParkedJobs``), and
``queueing.policy_tree`` memoizes the log's quota tree for every reader of a state.
"""
from __future__ import annotations

from gpusched.core.state import ClusterState
from gpusched.policies.placement.kept_index import KeptIndexes
from gpusched.policies.preemption.kept_movable import KeptMovable
from gpusched.policies.preemption.victim_index import VictimIndex
from gpusched.policies.queueing.keys import QueueKeys
from gpusched.policies.queueing.parking import ParkedJobs
from gpusched.policies.reservation.hosts import KeptHosts
from gpusched.policies.reservation.kept_ends import KeptEnds


class CycleMemory:
    __slots__ = ("state", "parked", "keys", "indexes", "hosts", "ends", "movable", "victims")

    def __init__(self) -> None:
        self.state: ClusterState | None = None   # the state what follows is kept for (``refresh``)
        self._start()

    def _start(self) -> None:
        self.parked: ParkedJobs = ParkedJobs()         # jobs known not to fit (``queueing.parking``)
        self.keys: QueueKeys = QueueKeys()             # waiting jobs' keys and shapes, fair share's queues, the job-test cursor
        self.indexes: KeptIndexes = KeptIndexes()      # the placement indexes: free capacity, MIG (``placement.kept_index``)
        self.hosts: KeptHosts = KeptHosts()            # the nodes that could ever host each shape, and which are open (``reservation.hosts``)
        self.ends: dict[str, KeptEnds] = {}            # pool -> its running jobs' ends (``reservation.kept_ends``)
        self.movable: dict[str, KeptMovable] = {}      # pool -> its jobs defragmentation may move (``preemption.kept_movable``)
        self.victims: VictimIndex = VictimIndex()      # the preemptor's candidate victims (``preemption.victim_index``)

    def refresh(self, state: ClusterState) -> None:
        """Start a cycle or a call on ``state``: another state than the last drops every
        structure (see the module doc). Idempotent within a cycle."""
        if state is not self.state:
            if self.state is not None:
                self._start()
            self.state = state

    def ends_of(self, pool: str) -> KeptEnds:
        """``pool``'s kept index of ends."""
        ends = self.ends.get(pool)
        if ends is None:
            ends = self.ends[pool] = KeptEnds()
        return ends

    def movable_of(self, pool: str) -> KeptMovable:
        """``pool``'s kept movable jobs."""
        movable = self.movable.get(pool)
        if movable is None:
            movable = self.movable[pool] = KeptMovable(pool)
        return movable
