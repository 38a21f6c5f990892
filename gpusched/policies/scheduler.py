"""One scheduling cycle: order the pending queue, place what fits, return proposals.

The cycle never writes the state: it books tentatively and releases before returning.
The caller (the placer service or the simulator) turns decisions into ``JobPlaced``
events; the reducer validates them when they come back from the log.
"""
from __future__ import annotations

from dataclasses import dataclass

from gpusched.core.model import WorkerAssignment
from gpusched.core.state import ClusterState
from gpusched.policies.booking import tentative
from gpusched.policies.placement import PLACEMENTS, place_gang
from gpusched.policies.queue import QUEUE_ORDERS


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    queue: str = "priority"
    placement: str = "best-fit"
    max_decisions: int = 10_000     # per cycle, to bound a cycle's latency


@dataclass(frozen=True, slots=True)
class Decision:
    job_id: str
    attempt: int
    workers: tuple[WorkerAssignment, ...]
    policy: str


class Scheduler:
    def __init__(self, config: SchedulerConfig = SchedulerConfig()) -> None:
        if config.queue not in QUEUE_ORDERS:
            raise ValueError(f"unknown queue policy {config.queue!r}; known: {sorted(QUEUE_ORDERS)}")
        if config.placement not in PLACEMENTS:
            raise ValueError(f"unknown placement policy {config.placement!r}; known: {sorted(PLACEMENTS)}")
        self.config = config
        self._order = QUEUE_ORDERS[config.queue]
        self._score = PLACEMENTS[config.placement]

    def cycle(self, state: ClusterState, now: float) -> list[Decision]:
        ready = [state.jobs[j] for j in state.pending if state.jobs[j].not_before <= now]
        decisions: list[Decision] = []
        with tentative(state) as booking:
            for job in self._order(state, ready, now):
                workers = place_gang(state, job, self._score, booking)
                if workers is not None:
                    decisions.append(Decision(job.job_id, job.attempt, workers, self.config.placement))
                    if len(decisions) >= self.config.max_decisions:
                        break
        return decisions
