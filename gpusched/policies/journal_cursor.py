"""Where a reader of the reducer's journals stands.

What a policy keeps beside one state between cycles (``touched_nodes``,
``reservation.kept_ends``, ``placement.fgd.task_mix.KeptMix``, ``queueing.fair_queue``,
``preemption.victim_index``) reads the jobs the reducer journalled since its last look
(``ClusterState.changes``) instead of comparing every job, and the nodes it journalled
(``ClusterState.node_changes``: registered, lost, cordoned, uncordoned, a GPU's health)
instead of comparing every node. ``JournalCursor`` keeps what that takes: the state read
(positions hold in that very object's journals only: a restored or another state has
its own), and the positions reached.

``read`` answers the jobs journalled since, ``read_nodes`` the nodes as well, or None
where a journal cannot say: another state, or entries dropped unread
(``reducer.note_changes``). A registration (a node added, or its inventory taken again:
pool, labels, GPUs, MIG mode) is journalled as the other node changes are; a reader that
keeps rows only per node it has (``registered=False``) is answered None then
(``ClusterState.nodes_registered`` moved) and starts over, one that adds and refreshes a
registered node's rows itself (``registered=True``) gets the node like any other.
Either way the cursor then stands at the journals' ends: the reader has read all, or
starts over from the state as it is.
"""
from __future__ import annotations

from typing import Mapping, cast

from gpusched.core.state import ClusterState, NodeState


class JournalCursor:
    __slots__ = ("state", "position", "node_position", "registered")

    def __init__(self) -> None:
        self.state: ClusterState | None = None
        self.position = 0
        self.node_position = 0   # in ``state.node_changes``
        self.registered = -1     # ``state.nodes_registered`` then

    def start(self, state: ClusterState) -> None:
        """Stand at the end of ``state``'s journals: the reader has taken ``state`` in whole."""
        self.state, self.position = state, state.changes_end()
        self.node_position, self.registered = state.node_changes_end(), state.nodes_registered

    def forget(self) -> None:
        """Read no state: the next ``read`` answers None."""
        self.state = None

    def read(self, state: ClusterState) -> list[str] | None:
        """The jobs journalled since the last read or start (a job may repeat), or None:
        ``state`` is not the state read then, or entries were dropped unread. Nodes are
        not looked at. Afterwards the cursor stands at the journals' ends."""
        changes = state.changes_since(self.position) if state is self.state else None
        self.start(state)
        return changes

    def read_nodes(self, state: ClusterState, jobs: bool = True,
                   registered: bool = False) -> tuple[list[str], list[str]] | None:
        """The jobs and the nodes journalled since the last read or start (either may
        repeat), or None: ``state`` is not the state read then, entries of either journal
        were dropped unread, or (unless ``registered``: the reader refreshes a registered
        node's rows itself) a node registered. Without ``jobs`` the jobs are not read (an
        empty list). Afterwards the cursor stands at both journals' ends."""
        changes = nodes = None
        if state is self.state and (registered or state.nodes_registered == self.registered):
            changes = state.changes_since(self.position) if jobs else []
            nodes = state.node_changes_since(self.node_position)
        self.start(state)
        return None if changes is None or nodes is None else (changes, nodes)


def registration_order(nodes: Mapping[str, NodeState], name: str) -> int:
    """``name``'s place in ``nodes`` (the state's nodes, in registration order), what a
    reader ranks a node added to its rows by: looked for from the end, where a node just
    added is."""
    keys = cast("dict[str, NodeState]", nodes)   # the state's dict: reversible
    for back, key in enumerate(reversed(keys)):
        if key == name:
            return len(nodes) - 1 - back
    raise KeyError(name)
