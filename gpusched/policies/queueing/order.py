"""Queue sort: the order in which pending jobs are offered to placement.

Every order takes ``(state, jobs, now, context)`` and returns a permutation of ``jobs``;
``context`` carries what an order may need beyond the state (quotas, decayed usage,
aging; see ``fairshare.QueueContext``) and is ignored by the orders that need nothing.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable

from gpusched.core.priority import priority_value
from gpusched.core.state import ClusterState, JobState
from gpusched.policies.queueing.fairshare import QueueContext, fair_share

QueueOrder = Callable[[ClusterState, Iterable[JobState], float, QueueContext | None], list[JobState]]
QueueKey = Callable[[JobState], Any]
QUEUE_ORDERS: dict[str, QueueOrder] = {}
# Orders that sort by a key of each job alone, and that key: how two jobs compare does
# not depend on the other jobs in the queue, so a cycle may leave jobs out before sorting
# (parking), and a job's key, which never changes while it waits, may be kept from one
# cycle to the next (``policies.queueing.keys``). Fair share does depend on the other jobs
# (each job ranks by its team's share with the jobs ahead of it counted), so parked jobs
# are sorted with the rest and skipped after.
QUEUE_KEYS: dict[str, QueueKey] = {}
KEYED_ORDERS = QUEUE_KEYS.keys()


def register_queue(name: str, key: QueueKey | None = None):
    def wrap(fn: QueueOrder) -> QueueOrder:
        QUEUE_ORDERS[name] = fn
        if key is not None:
            QUEUE_KEYS[name] = key
        return fn
    return wrap


def fifo_key(job: JobState) -> int:
    return job.seq


def priority_key(job: JobState) -> tuple[int, int]:
    return (-priority_value(job.spec.priority_class), job.seq)


@register_queue("fifo", key=fifo_key)
def fifo(state: ClusterState, jobs: Iterable[JobState], now: float,
         context: QueueContext | None = None) -> list[JobState]:
    return sorted(jobs, key=fifo_key)


@register_queue("priority", key=priority_key)
def priority_then_fifo(state: ClusterState, jobs: Iterable[JobState], now: float,
                       context: QueueContext | None = None) -> list[JobState]:
    return sorted(jobs, key=priority_key)


register_queue("fair-share")(fair_share)
