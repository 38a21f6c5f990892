"""Where a reader of the reducer's journal of changed jobs stands.

What a policy keeps beside one state between cycles (``touched_nodes``,
``reservation.kept_ends``, ``placement.frag_mix.KeptMix``, ``queueing.fair_queue``,
``preemption.victim_index``) reads the jobs the reducer journalled since its last look
(``ClusterState.changes``) instead of comparing every job. ``JournalCursor`` keeps what
that takes: the state read (positions hold in that very object's journal only: a
restored or another state has its own), the position reached, and the state's count of
node changes (``nodes_version``) then.

``read`` answers the jobs journalled since, or None where the journal cannot say:
another state, entries dropped unread (``reducer.note_changes``) or, for a reader that
derives from the nodes too, a node changed. ``read_nodes`` answers the nodes changed by
themselves as well (the reducer's journal of them, ``ClusterState.node_changes``), for a
reader that refreshes rows per node: None only where a node registered (its set of rows
may change) or a journal cannot say. Either way the cursor then stands at the journals'
ends: the reader has read all, or starts over from the state as it is.
"""
from __future__ import annotations

from gpusched.core.state import ClusterState


class JournalCursor:
    __slots__ = ("state", "position", "nodes_version", "node_position", "registered")

    def __init__(self) -> None:
        self.state: ClusterState | None = None
        self.position = 0
        self.nodes_version = -1
        self.node_position = 0   # in ``state.node_changes``
        self.registered = -1     # ``state.nodes_registered`` then

    def start(self, state: ClusterState) -> None:
        """Stand at the end of ``state``'s journal: the reader has taken ``state`` in whole."""
        self.state, self.position, self.nodes_version = state, state.changes_end(), state.nodes_version
        self.node_position, self.registered = state.node_changes_end(), state.nodes_registered

    def forget(self) -> None:
        """Read no state: the next ``read`` answers None."""
        self.state = None

    def nodes_moved(self, state: ClusterState) -> bool:
        """Whether a node changed (``nodes_version``) since the last read or start."""
        return state.nodes_version != self.nodes_version

    def read(self, state: ClusterState, nodes: bool = True) -> list[str] | None:
        """The jobs journalled since the last read or start (a job may repeat), or None:
        ``state`` is not the state read then, or entries were dropped unread, or (with
        ``nodes``) a node changed. Afterwards the cursor stands at the journal's end."""
        changes = state.changes_since(self.position) if state is self.state else None
        if nodes and state.nodes_version != self.nodes_version:
            changes = None
        self.start(state)
        return changes

    def read_nodes(self, state: ClusterState, jobs: bool = True) -> tuple[list[str], list[str]] | None:
        """The jobs and the nodes journalled since the last read or start (either may
        repeat), or None: ``state`` is not the state read then, entries of either journal
        were dropped unread, or a node registered (added, or its inventory taken again).
        Without ``jobs`` the jobs are not read (an empty list). Afterwards the cursor
        stands at both journals' ends."""
        changes = nodes = None
        if state is self.state and state.nodes_registered == self.registered:
            changes = state.changes_since(self.position) if jobs else []
            nodes = state.node_changes_since(self.node_position)
        self.start(state)
        return None if changes is None or nodes is None else (changes, nodes)
