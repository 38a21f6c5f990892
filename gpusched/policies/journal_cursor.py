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
derives from the nodes too, a node changed. Either way the cursor then stands at the
journal's end: the reader has read all, or starts over from the state as it is.
"""
from __future__ import annotations

from gpusched.core.state import ClusterState


class JournalCursor:
    __slots__ = ("state", "position", "nodes_version")

    def __init__(self) -> None:
        self.state: ClusterState | None = None
        self.position = 0
        self.nodes_version = -1

    def start(self, state: ClusterState) -> None:
        """Stand at the end of ``state``'s journal: the reader has taken ``state`` in whole."""
        self.state, self.position, self.nodes_version = state, state.changes_end(), state.nodes_version

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
