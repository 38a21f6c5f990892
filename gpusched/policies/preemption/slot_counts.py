"""``SlotCounts``: the worker slots of one job shape (pool, resources, worker count) on
every node of its pool that has any, kept through a round's changes like the placer's
views, so that a victim search knows the pool's total without counting every node."""
from __future__ import annotations

from typing import Iterable, Mapping

from gpusched.core.model import WorkerResources
from gpusched.core.state import ClusterState, NodeState
from gpusched.policies.preemption.victim_search import could_host, worker_slots
from gpusched.policies.statement import Statement


class SlotCounts:
    """Worker slots of ``res`` (at most ``cap`` a node) on the nodes of ``pool`` that could
    host it, as ``VictimSearch`` counts them; ``on`` holds the nodes with any, ``total``
    their sum. Told of changed nodes (``touch``) like any view of the placer."""

    def __init__(self, nodes: Mapping[str, NodeState], pool: str, res: WorkerResources, cap: int) -> None:
        self.nodes, self.pool, self.res, self.cap = nodes, pool, res, cap
        # Slots are counted by taking them on the nodes, then undone: on a statement of
        # its own, which tells no view.
        self._counter = Statement(ClusterState(nodes=nodes))
        self._hosts: dict[str, bool] = {}
        self.on: dict[str, int] = {}
        self.total = 0
        self.touch([name for name, node in nodes.items() if node.info.pool == pool])

    def touch(self, names: Iterable[str]) -> None:
        for name in names:
            node = self.nodes.get(name)
            if node is None or node.info.pool != self.pool:
                continue
            self.total -= self.on.pop(name, 0)
            if not node.schedulable:
                continue
            hosts = self._hosts.get(name)    # static capacity: asked only of nodes with slots
            n = worker_slots(self._counter, node, self.res, self.cap)
            if n and hosts is None:
                hosts = self._hosts[name] = could_host(node, self.res)
            if n and hosts:
                self.on[name] = n
                self.total += n
