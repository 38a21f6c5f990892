"""Which nodes changed since the last look, read from the reducer's journal.

What a policy keeps beside one state between cycles (``placement.kept_index``,
``reservation.hosts``) must look again at the nodes held before, or held now, by a job
journalled since (``ClusterState.changes``): a node's allocations change only with such
a job; and at the nodes that changed by themselves (cordoned, lost, a GPU's health:
``ClusterState.node_changes``). ``TouchedNodes`` remembers where each job's workers were
and answers those, or None when the kept structure must be rebuilt: another state, an
overrun journal, or (for a reader that does not add or refresh a registered node's rows
itself: ``registered=False``) a node registered (``nodes_registered``). ``nodes``: the
nodes changed by themselves of the last answer, those a registration may have changed.
"""
from __future__ import annotations

from gpusched.core.state import ClusterState
from gpusched.policies.journal_cursor import JournalCursor


class TouchedNodes:
    __slots__ = ("journal", "held_on", "registered", "nodes")

    def __init__(self, registered: bool = False) -> None:
        self.journal = JournalCursor()
        self.held_on: dict[str, set[str]] = {}   # job -> the nodes its workers held when last looked at
        self.registered = registered
        self.nodes: list[str] = []

    def since_last(self, state: ClusterState) -> set[str] | None:
        """The nodes to look at again since the last call, or None (then this reader has
        started over from ``state``: rebuild from it)."""
        read = self.journal.read_nodes(state, registered=self.registered)
        if read is None:
            self.nodes = []
            self._start(state)
            return None
        changes, changed_nodes = read
        self.nodes = changed_nodes
        nodes, jobs, held_on = state.nodes, state.jobs, self.held_on
        touched: set[str] = set(changed_nodes)
        for job_id in dict.fromkeys(changes):
            touched.update(held_on.pop(job_id, ()))
            holder = jobs.get(job_id)
            if holder is not None and holder.workers:
                on = {w.node for w in holder.workers}
                touched.update(on)
                if any(job_id in nodes[n].jobs for n in on if n in nodes):
                    held_on[job_id] = on
        return touched

    def _start(self, state: ClusterState) -> None:
        held_on: dict[str, set[str]] = {}
        for node in state.nodes.values():
            for job_id in node.jobs:
                held_on.setdefault(job_id, set()).add(node.name)
        self.held_on = held_on
