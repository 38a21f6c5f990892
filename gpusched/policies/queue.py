"""Queue sort: the order in which pending jobs are offered to placement.

Every order takes ``(state, jobs, now, context)`` and returns a permutation of ``jobs``;
``context`` carries what an order may need beyond the state (quotas, decayed usage,
aging; see ``fairshare.QueueContext``) and is ignored by the orders that need nothing.
"""
from __future__ import annotations

from typing import Callable, Iterable

from gpusched.core.priority import priority_value
from gpusched.core.state import ClusterState, JobState
from gpusched.policies.fairshare import QueueContext, fair_share

QueueOrder = Callable[[ClusterState, Iterable[JobState], float, QueueContext | None], list[JobState]]
QUEUE_ORDERS: dict[str, QueueOrder] = {}
# Orders that sort by a key of each job alone: how two jobs compare does not depend on
# the other jobs in the queue, so a cycle may leave jobs out before sorting (parking).
# Fair share does depend on them (each job ranks by its team's share with the jobs ahead
# of it counted), so parked jobs are sorted with the rest and skipped after.
KEYED_ORDERS: set[str] = set()


def register_queue(name: str, keyed: bool = False):
    def wrap(fn: QueueOrder) -> QueueOrder:
        QUEUE_ORDERS[name] = fn
        if keyed:
            KEYED_ORDERS.add(name)
        return fn
    return wrap


@register_queue("fifo", keyed=True)
def fifo(state: ClusterState, jobs: Iterable[JobState], now: float,
         context: QueueContext | None = None) -> list[JobState]:
    return sorted(jobs, key=lambda j: j.seq)


@register_queue("priority", keyed=True)
def priority_then_fifo(state: ClusterState, jobs: Iterable[JobState], now: float,
                       context: QueueContext | None = None) -> list[JobState]:
    return sorted(jobs, key=lambda j: (-priority_value(j.spec.priority_class), j.seq))


register_queue("fair-share")(fair_share)
