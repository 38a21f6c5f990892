"""The nodes that could ever host a worker of a shape, kept from one cycle to the next.

A reservation sweep (``backfill._offer_at_now``) starts with one pass over every node of
the cluster, to learn which could ever host a worker of the job (its pool, model, size,
healthy GPUs: ``could_ever_host``) and offer those at ``now``; on a pool of thousands of
nodes that pass was a third of a busy cycle, though what it finds depends on the nodes
alone, and nodes change rarely. So it is kept by (pool, per-worker resources) for one
state while no node was added or changed (``ClusterState.nodes_version``, bumped by the
reducer for every registration, status or GPU health change). The tentative changes of a
cycle's ``Statement`` include node status (nominee holds cordon nodes): the caller keeps
hosts only in cycles without those (as ``at_now``).

Of those hosts, a sweep offers at ``now`` only the nodes with a GPU not wholly taken
(``OpenNodes``): on a full pool that is a few, and a node with none cannot take a worker
that needs a GPU, the more so later in the cycle, whose bookings and holds only take
capacity. Which nodes are open is kept between cycles too, from the committed state
(before the cycle books anything): a node's allocations change only with an event that
the reducer journals a job for (``ClusterState.changes``), so only the nodes that those
jobs held before or hold now are looked at again.

``tests/unit/policies/test_kept_hosts.py`` holds what is kept against a fresh pass after
random node and job changes.
"""
from __future__ import annotations

from gpusched.core.model import WorkerResources
from gpusched.core.state import ClusterState, JobState, NodeState
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


def _classes(state: ClusterState) -> dict[tuple, list[tuple[int, NodeState]]]:
    classes: dict[tuple, list[tuple[int, NodeState]]] = {}
    for i, node in enumerate(state.nodes.values()):
        info = node.info
        key = (info.pool, node.schedulable, node.model, info.cpu_milli, info.memory_mib,
               len([g for g in node.gpus if g.healthy]))
        classes.setdefault(key, []).append((i, node))
    return classes


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

    __slots__ = ("state", "version", "found", "classes", "open")

    def __init__(self) -> None:
        self.state: ClusterState | None = None
        self.version = -1
        self.found: dict[tuple[str, WorkerResources], Hosts] = {}
        # (pool, ready, model, cpu, memory, healthy GPUs) -> [(position in the state, node)]
        self.classes: dict[tuple, list[tuple[int, NodeState]]] = {}
        self.open = OpenNodes()   # refreshed by the caller at the start of each cycle

    def hosts(self, state: ClusterState, job: JobState) -> Hosts:
        if state is not self.state or state.nodes_version != self.version:
            self.state, self.version, self.found = state, state.nodes_version, {}
            self.classes = _classes(state)
        elif len(self.found) >= MAX_KEPT:
            self.found = {}
        spec = job.spec
        key = (spec.pool, spec.resources)
        found = self.found.get(key)
        if found is None:
            res = spec.resources
            need = max(res.gpus, 1 if res.milli else 0)
            taken = [members for (pool, ready, model, cpu, memory, healthy), members in self.classes.items()
                     if pool == spec.pool and ready and res.allows(model) and cpu >= res.cpu_milli
                     and memory >= res.memory_mib and healthy >= need]
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
        self.journal = TouchedNodes()
        self.closed: set[str] = set()

    def refresh(self, state: ClusterState) -> None:
        """Call with no tentative change on ``state`` (the cycle has booked nothing yet)."""
        touched = self.journal.since_last(state)
        nodes = state.nodes
        if touched is None:   # another state, a node change or an overrun journal
            self.closed = {node.name for node in nodes.values() if not is_open(node)}
            return
        closed = self.closed
        for name in touched:
            node = nodes.get(name)
            if node is None or is_open(node):
                closed.discard(name)
            else:
                closed.add(name)
