"""The placement indexes (``FreeIndex``, ``MigIndex``) kept from one cycle to the next.

Building a pool's free-capacity index and its MIG indexes reads every node; at thousands
of nodes that was a sixth of a busy cycle, though between two cycles only the nodes of
the few jobs placed, ended or moved changed. ``KeptIndexes`` keeps them for one state
(the caller's ``CycleMemory.indexes``, per partition) and, at each cycle's start, while
the state is the log's (the cycle has booked nothing yet), brings them in step:

* the nodes the last cycle's statement changed tentatively (bookings, holds, nominees'
  cordons: it tells every view, this one included) are looked at again, since the
  statement rolled those changes back after the indexes last heard of them;
* so are the nodes held before, or held now, by a job the reducer journalled since
  (``ClusterState.changes``): a node's allocations change only with such a job;
* and the nodes registered, lost, cordoned, uncordoned or with a GPU's health changed
  since (``ClusterState.node_changes``): a node's place among an index's rows is looked
  at again; where a node registered since (added, or its inventory taken again:
  ``nodes_registered`` moved), each index first takes those nodes into its rows or out
  of them (``renew``: the pool's nodes, its MIG nodes, their racks), and an index
  without ``renew`` is dropped, built again when asked;
* the journal overrun, or another state: every index is dropped and built again when
  asked.

So at each cycle's start a kept index is what a fresh build from the state would be
(``tests/unit/policies/placement/test_kept_index.py``), and the cycle decides as one without it.
"""
from __future__ import annotations

from typing import Callable, Iterable

from gpusched.core.state import ClusterState
from gpusched.policies.statement import NodeView, Statement
from gpusched.policies.touched_nodes import TouchedNodes

KEPT = "placement-indexes"     # this view's key in a statement


class KeptIndexes:
    """The indexes of one state by their key in ``Statement.views``, and the nodes that
    must be looked at again before the next cycle reads them."""

    __slots__ = ("journal", "indexes", "dirty", "registrations")

    def __init__(self) -> None:
        self.journal = TouchedNodes(registered=True)
        self.indexes: dict[object, NodeView] = {}
        self.dirty: set[str] = set()             # nodes the statement changed since the last refresh
        self.registrations = 0                   # ``state.nodes_registered`` at the last refresh

    def touch(self, names: Iterable[str]) -> None:
        """A view of the statement: what it changed, to look at again at the next refresh."""
        self.dirty.update(names)

    def install(self, state: ClusterState, statement: Statement) -> None:
        """Refresh (call before the cycle changes anything) and lend the indexes to
        ``statement``; from then on it tells this object, too, of every node it changes."""
        self.refresh(state)
        statement.views[KEPT] = self
        statement.views.update(self.indexes)

    def keep(self, key: object, index: NodeView) -> None:
        """An index first built this cycle (from the tentative state: the nodes changed
        before it was built are in ``dirty``, looked at again at the next refresh)."""
        self.indexes[key] = index

    def refresh(self, state: ClusterState) -> None:
        journalled = self.journal.since_last(state)
        registered, self.registrations = state.nodes_registered != self.registrations, state.nodes_registered
        if journalled is None:   # another state or an overrun journal
            self.indexes, self.dirty = {}, set()
            return
        if registered:
            self._renew(tuple(dict.fromkeys(self.journal.nodes)))
        touched, self.dirty = self.dirty, set()
        touched |= journalled
        if touched:
            names = tuple(touched)
            for index in self.indexes.values():
                index.touch(names)

    def _renew(self, names: tuple[str, ...]) -> None:
        """Nodes that may have registered: into or out of each index's rows."""
        for key, index in list(self.indexes.items()):
            renew = getattr(index, "renew", None)
            if renew is None:
                del self.indexes[key]   # rows it cannot renew: built again when asked
            else:
                renew(names)


def view(statement: Statement, key: object, build: Callable[[], NodeView]) -> NodeView:
    """The statement's view ``key``, built (and kept, in a cycle that keeps indexes) if
    it has none yet."""
    index = statement.views.get(key)
    if index is None:
        index = statement.views[key] = build()
        kept = statement.views.get(KEPT)
        if kept is not None:
            kept.keep(key, index)   # type: ignore[attr-defined]
    return index

