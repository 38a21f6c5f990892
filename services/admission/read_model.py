"""Admission's read side: queries over the states the log follower folds, one per
partition, and who submitted each live job (only this API needs that)."""
from __future__ import annotations

from gpusched.adapters.log.follower import LogFollower
from gpusched.adapters.log.publisher import partition_for
from gpusched.core import events as ev
from gpusched.core.state import ClusterState, JobState, NodeState, ServiceState
from gpusched.core.topology import pool_levels
from gpusched.core.validation import PoolShape


class Submitters:
    """Who submitted each live job (``JobSubmitted.principal``): a member may cancel only
    its own jobs. Kept here, from the events admission folds, not in the folded state:
    only this API needs it. A job leaves when it ends (it cannot be cancelled then), so
    this holds only live jobs."""

    def __init__(self) -> None:
        self.by_job: dict[str, str] = {}

    def on_event(self, event: ev.Event, outcome, state: ClusterState) -> None:
        if not outcome.accepted:
            return
        if type(event) is ev.JobSubmitted:
            self.by_job[event.job_id] = event.principal
        for job_id in outcome.jobs:
            job = state.jobs.get(job_id)
            if job is None or job.phase.terminal:
                self.by_job.pop(job_id, None)


class ReadModel:
    """Queries over the follower's per-partition states."""

    def __init__(self, follower: LogFollower, partitions: int, submitters: Submitters | None = None) -> None:
        self.follower = follower
        self.partitions = partitions
        self.submitters = submitters or Submitters()
        # Bumped by the service for every node registration folded (a node's inventory
        # changes only then): the pool shapes kept below are valid until it moves.
        self.inventory_changes = 0
        self._shapes: dict[str, tuple[ClusterState, int, PoolShape]] = {}

    def state_for_pool(self, pool: str) -> ClusterState | None:
        return self.follower.states.get(partition_for(pool, self.partitions))

    def job(self, job_id: str) -> JobState | None:
        for state in self.follower.states.values():
            job = state.jobs.get(job_id)
            if job is not None:
                return job
        return None

    def node(self, name: str) -> NodeState | None:
        for state in self.follower.states.values():
            if name in state.nodes:
                return state.nodes[name]
        return None

    def pool_nodes(self, pool: str) -> list[NodeState]:
        state = self.state_for_pool(pool)
        return state.pool_nodes(pool) if state else []

    def pool_shape(self, pool: str) -> PoolShape:
        """What submissions to ``pool`` are validated against; rebuilt (a scan of the
        pool's nodes) only after a node registered or the partition's state was replaced."""
        state = self.state_for_pool(pool)
        kept = self._shapes.get(pool)
        if kept is not None and kept[0] is state and kept[1] == self.inventory_changes:
            return kept[2]
        shape = PoolShape.of(state.pool_nodes(pool)) if state is not None else PoolShape()
        if state is not None:
            self._shapes[pool] = (state, self.inventory_changes, shape)
        return shape

    def pool_limits(self, pool: str) -> tuple[float, float]:
        state = self.state_for_pool(pool)
        return state.pool_limits.get(pool, (0.0, 0.0)) if state is not None else (0.0, 0.0)

    def pool_levels(self, pool: str) -> tuple[str, ...]:
        """The pool's topology levels, top down: as declared, else the default ones."""
        state = self.state_for_pool(pool)
        return pool_levels(state.pool_topology if state is not None else {}, pool)

    def jobs(self):
        for state in self.follower.states.values():
            yield from state.jobs.values()

    def service(self, name: str) -> tuple[ServiceState, ClusterState] | None:
        """The service and the state of its pool's partition (which holds its replicas)."""
        for state in self.follower.states.values():
            service = state.services.get(name)
            if service is not None:
                return service, state
        return None

    def services(self):
        for state in self.follower.states.values():
            for service in state.services.values():
                yield service, state

    def known_pools(self) -> set[str]:
        return {pool for state in self.follower.states.values() for pool in state.pools}
