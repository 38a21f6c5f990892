"""Queue sort: the order in which pending jobs are offered to placement."""
from __future__ import annotations

from typing import Callable, Iterable

from gpusched.core.priority import priority_value
from gpusched.core.state import ClusterState, JobState

QueueOrder = Callable[[ClusterState, Iterable[JobState], float], list[JobState]]
QUEUE_ORDERS: dict[str, QueueOrder] = {}


def register_queue(name: str):
    def wrap(fn: QueueOrder) -> QueueOrder:
        QUEUE_ORDERS[name] = fn
        return fn
    return wrap


@register_queue("fifo")
def fifo(state: ClusterState, jobs: Iterable[JobState], now: float) -> list[JobState]:
    return sorted(jobs, key=lambda j: j.seq)


@register_queue("priority")
def priority_then_fifo(state: ClusterState, jobs: Iterable[JobState], now: float) -> list[JobState]:
    return sorted(jobs, key=lambda j: (-priority_value(j.spec.priority_class), j.seq))
