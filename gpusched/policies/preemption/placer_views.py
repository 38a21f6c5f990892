"""The placer's views of the nodes in one preemption call, and, where the caller keeps
them, between calls.

A call asks where the placer would put each pending job it examines (``place_gang``),
on the state as the call's scratch statement left it. The placer reads the pool through
views (``FreeIndex``, ``MigIndex``, gang capacities: ``Statement.views``), which cost a
read of every node of the pool to build. ``PlacerViews`` holds them for the call on a
statement of their own (the scratch's bookings and releases show through the shared
nodes; a placement tried is rolled back on it) and tells them, before each question, of
the nodes the scratch changed since the last (``ScratchChanges``).

The preemptor keeps them between rounds as the placer keeps its own between cycles
(``kept_index``, in the caller's ``CycleMemory.indexes``, per partition; its preempt and
defrag actions read the same memory, one call after the other): at the call's start,
while the nodes are the log's, the kept views are brought in step with the reducer's
journal and with the nodes the last call's scratch changed that they were told of (undone
since: each is noted as it is told); a node change, an overrun journal or
another state drops them. So at each call's start a kept view is what a fresh build
from the state would be, and the call decides as one without it
(``tests/unit/policies/preemption/test_kept_placer_views.py``).

The placer's statement is on a copy of the state holding the nodes only (its usage table
its own). What a placement policy reads of the state's jobs is lent to it (the log state,
``statement.lend``): FGD's pool mixes of waiting and running jobs, counted once at the
call's start (``fgd.task_mix.fix_mixes``, brought in step from the kept counts), and gpu-clustering's node tags (the shapes of the jobs on each node), so the
question is scored as the placer's cycle scores it
(``tests/unit/policies/preemption/test_preemption_fgd_mix.py``,
``tests/unit/policies/preemption/test_preemption_clustering_tags.py``).
"""
from __future__ import annotations

from typing import Callable, Mapping

from gpusched.core.model import WorkerAssignment
from gpusched.core.state import ClusterState, JobState, NodeState
from gpusched.policies.placement.gang import Placement, place_gang
from gpusched.policies.placement.kept_index import KeptIndexes
from gpusched.policies.preemption.slot_counts import ScratchChanges
from gpusched.policies.statement import NodeView, Statement, lend, tentative


class PlacerViews:
    """The placer's statement and views of one call on ``state``; ``indexes``: the
    caller's kept placement indexes, which keep them between calls on this state;
    ``score``: the call's placement policy, if known at the call's start (what it counts
    of the state's jobs is then counted there, see ``statement.lend``)."""

    def __init__(self, state: ClusterState, touched: ScratchChanges, indexes: KeptIndexes,
                 score: Placement | None = None) -> None:
        self.state, self.touched, self.indexes = state, touched, indexes
        self.score = score
        self.statement: Statement | None = None

    def open(self) -> None:
        """Call while the nodes are the log's (the scratch has changed nothing yet)."""
        # The nodes shared (so tentative releases show), the usage table private (so its
        # own tentative bookings never touch the state's): all place_gang reads.
        nodes_only = ClusterState(nodes=self.state.nodes, pool_topology=self.state.pool_topology)
        statement = self.statement = Statement(nodes_only)
        self.indexes.install(self.state, statement)
        lend(statement, self.state, self.score)

    def close(self) -> None:
        """End the call. The kept views need not hear of the scratch's undoing here: every
        node a view was told of is noted by the kept set at that catch-up (it is one of
        the statement's views) and looked at again at the next call's start; a node
        changed since the last catch-up no view saw changed, and undone it is as they
        have it."""
        statement, self.statement = self.statement, None
        if statement is not None:
            statement.close()
        self.touched.names.clear()

    def place(self, job: JobState, score: Placement) -> tuple[WorkerAssignment, ...] | None:
        """Where the placer would put ``job`` on the nodes as they are now."""
        placer = self.statement
        if placer is None:   # no call open: nothing would tell kept views of changes
            view = ClusterState(nodes=self.state.nodes, pool_topology=self.state.pool_topology)
            with tentative(view) as statement:
                lend(statement, self.state, score)
                return place_gang(view, job, score, statement)
        self._catch_up(placer)
        mark = placer.checkpoint()
        try:
            return place_gang(placer.state, job, score, placer)
        finally:
            placer.rollback(mark)

    def view(self, key: object, build: Callable[[Mapping[str, NodeState]], NodeView]) -> NodeView | None:
        """A view of the nodes for the call beside the placer's (built by ``build`` on first
        use, told of the scratch's changes); None with no call open."""
        placer = self.statement
        if placer is None:
            return None
        self._catch_up(placer)
        view = placer.views.get(key)
        if view is None:
            view = placer.views[key] = build(self.state.nodes)
        return view

    def _catch_up(self, placer: Statement) -> None:
        """Tell the views of the nodes the scratch changed since they last heard (the kept
        set among them: it notes them, to be looked at again at the next call's start)."""
        touched = self.touched.names
        if touched and placer.views:
            names = tuple(touched)
            for kept in placer.views.values():
                kept.touch(names)
        touched.clear()
