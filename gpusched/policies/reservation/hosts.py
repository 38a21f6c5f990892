"""The nodes that could ever host a worker of a shape, kept from one cycle to the next.

A reservation sweep (``backfill._offer_at_now``) starts with one pass over every node of
the cluster, to learn which could ever host a worker of the job (its pool, model, size,
healthy GPUs: ``could_ever_host``) and offer those at ``now``; on a pool of thousands of
nodes that pass was a third of a busy cycle, though what it finds depends on the nodes
alone, and nodes change rarely. So it is kept by (pool, per-worker resources) for one
state; a node registered (added, or its inventory taken again), cordoned, uncordoned,
lost or with a GPU's health changed (the reducer journals it,
``ClusterState.node_changes``) moves to its new class and in or out of each shape's hosts.
The tentative changes of a cycle's ``Statement`` include node status (nominee holds
cordon nodes): the caller keeps hosts only in cycles without those (as ``at_now``).

Of those hosts, a sweep offers at ``now`` only the nodes with a GPU not wholly taken
(``OpenNodes``): on a full pool that is a few, and a node with none cannot take a worker
that needs a GPU, the more so later in the cycle, whose bookings and holds only take
capacity. Which nodes are open is kept between cycles too, from the committed state
(before the cycle books anything): a node's allocations change only with an event that
the reducer journals a job for (``ClusterState.changes``), so only the nodes that those
jobs held before or hold now are looked at again.

``tests/unit/policies/reservation/test_kept_hosts.py`` holds what is kept against a fresh pass after
random node and job changes.
"""
from __future__ import annotations

from bisect import bisect_left
from typing import Mapping

from gpusched.core.model import WorkerResources
from gpusched.core.state import ClusterState, JobState, NodeState
from gpusched.policies.journal_cursor import JournalCursor, registration_order
from gpusched.policies.touched_nodes import TouchedNodes

# Shapes kept at most: past it they are forgotten and found again as cycles need them.
MAX_KEPT = 4096

Hosts = tuple[list[NodeState], set[str]]   # the nodes in the state's order, and their names


def could_ever_host(node: NodeState, job: JobState) -> bool:
    """Whether ``node`` could host a worker of ``job`` once everything on it ended."""
    res, info = job.spec.resources, node.info
    return (info.pool == job.spec.pool and node.schedulable and res.allows(node.model)
            and info.cpu_milli >= res.cpu_milli and info.memory_mib >= res.memory_mib
            and len([g for g in node.gpus if g.healthy]) >= max(res.gpus, 1 if res.milli else 0))


def _class_of(node: NodeState) -> tuple:
    info = node.info
    return (info.pool, node.schedulable, node.model, info.cpu_milli, info.memory_mib,
            len([g for g in node.gpus if g.healthy]))


def _classes(state: ClusterState) -> dict[tuple, list[tuple[int, NodeState]]]:
    classes: dict[tuple, list[tuple[int, NodeState]]] = {}
    for i, node in enumerate(state.nodes.values()):
        classes.setdefault(_class_of(node), []).append((i, node))
    return classes


def _hosts_shape(key: tuple, pool: str, res: WorkerResources) -> bool:
    """Whether the nodes of class ``key`` could ever host a worker of ``res`` in ``pool``
    (``could_ever_host``, from the class)."""
    node_pool, ready, model, cpu, memory, healthy = key
    return (node_pool == pool and ready and res.allows(model) and cpu >= res.cpu_milli
            and memory >= res.memory_mib and healthy >= max(res.gpus, 1 if res.milli else 0))


def _position(member: tuple[int, NodeState]) -> int:
    return member[0]


def find_hosts(state: ClusterState, job: JobState) -> Hosts:
    nodes = [node for node in state.nodes.values() if could_ever_host(node, job)]
    return nodes, {node.name for node in nodes}


class KeptHosts:
    """``find_hosts`` by (pool, resources), for one state while its nodes stay as they were.

    What ``could_ever_host`` reads of a node is its class (pool, readiness, model, CPU,
    memory, healthy GPUs): the nodes are grouped by class once while they stay, so a shape
    not seen before is answered from the few classes, not from every node."""

    __slots__ = ("journal", "found", "classes", "where", "open")

    def __init__(self) -> None:
        self.journal = JournalCursor()   # the state kept for; only its node journal is read
        self.found: dict[tuple[str, WorkerResources], Hosts] = {}
        # (pool, ready, model, cpu, memory, healthy GPUs) -> [(position in the state, node)]
        self.classes: dict[tuple, list[tuple[int, NodeState]]] = {}
        self.where: dict[str, tuple[int, tuple]] = {}   # node -> (its position, its class)
        self.open = OpenNodes()   # refreshed by the caller at the start of each cycle

    def _refresh(self, state: ClusterState) -> None:
        """In step with ``state``'s nodes: rebuilt where the journal cannot say (another
        state, an overrun), else the nodes journalled moved (a node added joins)."""
        read = self.journal.read_nodes(state, jobs=False, registered=True)
        if read is None:
            self.found, self.classes = {}, _classes(state)
            self.where = {node.name: (i, key) for key, members in self.classes.items() for i, node in members}
            return
        if len(self.found) >= MAX_KEPT:
            self.found = {}
        for name in set(read[1]):
            self._move(state.nodes, name)

    def _move(self, state_nodes: Mapping[str, NodeState], name: str) -> None:
        """The node ``name`` to its class now (a node added: into its class at its place
        in the state's order), and in or out of each kept shape's hosts."""
        node, classes = state_nodes[name], self.classes
        key = _class_of(node)
        placed = self.where.get(name)
        if placed is None:
            i = registration_order(state_nodes, name)
        else:
            i, was = placed
            if key == was:
                return
            members = classes[was]
            del members[bisect_left(members, (i,))]
            if not members:
                del classes[was]
        members = classes.setdefault(key, [])
        members.insert(bisect_left(members, (i,)), (i, node))
        self.where[name] = (i, key)
        order = self._order_of
        for shape, (nodes, names) in self.found.items():
            hosts = _hosts_shape(key, *shape)
            if hosts != (name in names):   # a new list: a cycle may still hold the old one
                if hosts:
                    at = bisect_left(nodes, i, key=order)
                    self.found[shape] = (nodes[:at] + [node] + nodes[at:], names | {name})
                else:
                    self.found[shape] = ([n for n in nodes if n is not node], names - {name})

    def _order_of(self, node: NodeState) -> int:
        return self.where[node.name][0]

    def hosts(self, state: ClusterState, job: JobState) -> Hosts:
        if state is not self.journal.state or state.node_changes_end() != self.journal.node_position \
                or state.nodes_registered != self.journal.registered:
            self._refresh(state)
        spec = job.spec
        key = (spec.pool, spec.resources)
        found = self.found.get(key)
        if found is None:
            res = spec.resources
            taken = [members for klass, members in self.classes.items() if _hosts_shape(klass, spec.pool, res)]
            if len(taken) == 1:
                nodes = [node for _, node in taken[0]]
            else:   # several classes: back in the state's order
                nodes = [node for _, node in sorted((m for members in taken for m in members), key=_position)]
            found = self.found[key] = (nodes, {node.name for node in nodes})
        return found

    def offered_at_now(self, state: ClusterState, job: JobState) -> tuple[list[NodeState], set[str]]:
        """The hosts of ``job``'s shape that a sweep offers at ``now``, in the state's
        order (the open ones, for a worker that needs a GPU), and the names of all hosts."""
        nodes, names = self.hosts(state, job)
        if needs_gpu(job.spec.resources):
            closed = self.open.closed
            nodes = [node for node in nodes if node.info.name not in closed]
        return nodes, names


def is_open(node: NodeState) -> bool:
    """Whether some GPU of ``node`` might take a worker: one healthy, whole GPUs allowed,
    not cut into MIG and not wholly taken, or one that takes a MIG slice. What every fit
    of a worker that needs a GPU needs (``gpu_fit.pick_gpus``)."""
    return any((g.healthy and g.whole_ok and g.mig_mask == 0 and g.used_milli < 1000) or g.takes_mig()
               for g in node.gpus)


def needs_gpu(res: WorkerResources) -> bool:
    return res.gpus > 0 or res.gpu_milli > 0 or res.is_mig


class OpenNodes:
    """The names of the nodes that are not open (``is_open``), kept for one state between
    cycles: brought in step at the start of each cycle (``refresh``), while the state is
    the log's, from the jobs the reducer journalled since."""

    __slots__ = ("journal", "closed")

    def __init__(self) -> None:
        self.journal = TouchedNodes(registered=True)   # a registered node is looked at as any
        self.closed: set[str] = set()

    def refresh(self, state: ClusterState) -> None:
        """Call with no tentative change on ``state`` (the cycle has booked nothing yet)."""
        touched = self.journal.since_last(state)
        nodes = state.nodes
        if touched is None:   # another state or an overrun journal
            self.closed = {node.name for node in nodes.values() if not is_open(node)}
            return
        closed = self.closed
        for name in touched:
            node = nodes.get(name)
            if node is None or is_open(node):
                closed.discard(name)
            else:
                closed.add(name)
