"""``SlotCounts``: the worker slots of one job shape (pool, resources, worker count) on
every node of its pool that has any, kept through a round's changes like the placer's
views (and between rounds by ``VictimIndex``, told of the nodes that changed), so that a
victim search knows the pool's total without counting every node. ``ScratchChanges``: the
nodes a round's scratch statement changed."""
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

    def touch(self, names: Iterable[str], registered: bool = False) -> None:
        """Count ``names`` again; ``registered``: their registration or GPUs' health may
        have changed too (what ``could_host`` reads)."""
        for name in names:
            self.total -= self.on.pop(name, 0)
            if registered:
                self._hosts.pop(name, None)
            node = self.nodes.get(name)
            if node is None or node.info.pool != self.pool or not node.schedulable:
                continue
            hosts = self._hosts.get(name)    # static capacity: asked only of nodes with slots
            n = worker_slots(self._counter, node, self.res, self.cap)
            if n and hosts is None:
                hosts = self._hosts[name] = could_host(node, self.res)
            if n and hosts:
                self.on[name] = n
                self.total += n


class ScratchChanges:
    """A view of a round's scratch statement that only notes which nodes it changed: the
    placer's views hear of them at the next ``place``, not at every slot count's take and
    give (a victim search touches the same few nodes many times over); ``ever``: every
    node changed in the round, what counts kept beyond it must count again."""

    def __init__(self) -> None:
        self.names: set[str] = set()
        self.ever: set[str] = set()

    def touch(self, names: Iterable[str]) -> None:
        self.names.update(names)
        self.ever.update(names)
