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

``tests/unit/policies/test_kept_hosts.py`` holds what is kept against a fresh pass after
random node changes.
"""
from __future__ import annotations

from gpusched.core.model import WorkerResources
from gpusched.core.state import ClusterState, JobState, NodeState

# Shapes kept at most: past it they are forgotten and found again as cycles need them.
MAX_KEPT = 4096

Hosts = tuple[list[NodeState], set[str]]   # the nodes in the state's order, and their names


def could_ever_host(node: NodeState, job: JobState) -> bool:
    """Whether ``node`` could host a worker of ``job`` once everything on it ended."""
    res, info = job.spec.resources, node.info
    return (info.pool == job.spec.pool and node.schedulable and res.allows(node.model)
            and info.cpu_milli >= res.cpu_milli and info.memory_mib >= res.memory_mib
            and len([g for g in node.gpus if g.healthy]) >= max(res.gpus, 1 if res.milli else 0))


def find_hosts(state: ClusterState, job: JobState) -> Hosts:
    nodes = [node for node in state.nodes.values() if could_ever_host(node, job)]
    return nodes, {node.name for node in nodes}


class KeptHosts:
    """``find_hosts`` by (pool, resources), for one state while its nodes stay as they were."""

    __slots__ = ("state", "version", "found")

    def __init__(self) -> None:
        self.state: ClusterState | None = None
        self.version = -1
        self.found: dict[tuple[str, WorkerResources], Hosts] = {}

    def hosts(self, state: ClusterState, job: JobState) -> Hosts:
        if state is not self.state or state.nodes_version != self.version or len(self.found) >= MAX_KEPT:
            self.state, self.version, self.found = state, state.nodes_version, {}
        key = (job.spec.pool, job.spec.resources)
        found = self.found.get(key)
        if found is None:
            found = self.found[key] = find_hosts(state, job)
        return found
