"""What a cycle computes per waiting job that does not change while it waits, kept from
one cycle to the next: its queue key and its shape.

During a burst the pool is full and thousands of jobs wait, but every few milliseconds
a job ends, capacity grows, parking (``policies.queueing.parking``) starts over, and the next
cycle offers the whole queue again. Most of that cycle was recomputing, for each waiting
job, its sort key and its shape — (pool, workers, per-worker resources), what decides
whether it fits — and hashing a resources dataclass to learn that the shape already
failed. Both depend on the job alone: the key on its priority class and submission
order (``policies.queueing.order.QUEUE_KEYS``), the shape on its spec. So they are computed once,
when a job is first seen, and the shape becomes a small int that is cheap to look up.

A job id can come back as another job: retention (``core.retention``) drops a finished
job and frees its idempotency key, and the same key yields the same id. The new job has
a new ``seq`` (the reducer numbers every submission), so an entry counts only for the
``seq`` it was made for. The caller keeps one per pool state, in its ``CycleMemory``
(``policies.memory``; the placer: one per owned partition). Fair share, whose order has no per-job key,
keeps its per-team queues here instead (``fair_queues``, ``policies.queueing.fair_queue``).
"""
from __future__ import annotations

from typing import Any

from gpusched.core.state import ClusterState, JobState
from gpusched.policies.queueing.cursor import JobTestCursor
from gpusched.policies.queueing.fair_queue import TeamQueues
from gpusched.policies.queueing.order import QueueKey
from gpusched.policies.queueing.shape_key import shape_key

# Bounds, whatever the log holds: entries of jobs that left the queue are dropped once
# they outnumber the queue; shapes are forgotten (and renumbered) past this many.
MAX_SHAPES = 65_536


class QueueKeys:
    __slots__ = ("_key", "_entries", "_shapes", "_fair", "_waiting", "cursor")

    def __init__(self) -> None:
        self._key: QueueKey | None = None
        self._entries: dict[str, tuple[int, Any, int]] = {}   # job id -> (seq, key, shape)
        self._shapes: dict[tuple, int] = {}   # ``shape_key`` -> number
        self._fair: TeamQueues | None = None
        self._waiting: tuple[int, list[tuple[int, str]]] | None = None   # (shapes numbered, waiting_shapes)
        # Where a cycle stopped on its budget of jobs tested, for the next to continue.
        self.cursor = JobTestCursor()

    def bind(self, key: QueueKey | None, state: ClusterState) -> None:
        """Start a cycle ordered by ``key`` (None: an order with no per-job key)."""
        if key is not self._key or len(self._shapes) > MAX_SHAPES:
            self._entries.clear()
            self._shapes.clear()
            self._key = key
        elif len(self._entries) > 2 * len(state.pending) + 64:
            pending = state.pending
            self._entries = {j: e for j, e in self._entries.items() if j in pending}

    def _entry(self, job: JobState) -> tuple[int, Any, int]:
        entry = self._entries.get(job.job_id)
        if entry is None or entry[0] != job.seq:
            spec = job.spec
            shape = shape_key(spec)
            number = self._shapes.get(shape)
            if number is None:
                number = self._shapes[shape] = len(self._shapes)
            key = self._key(job) if self._key is not None else None
            entry = self._entries[job.job_id] = (job.seq, key, number)
        return entry

    def key(self, job: JobState) -> Any:
        return self._entry(job)[1]

    def shape(self, job: JobState) -> int:
        return self._entry(job)[2]

    def waiting_shapes(self) -> list[tuple[int, str]] | None:
        """(shape, pool) of every job in fair share's queues (``fair_queues``, as last
        synced); a shape not numbered yet is -1, which no cycle has seen fail. None
        without those queues."""
        if self._fair is None:
            return None
        # Asked after every offer: kept until the queues are synced again (``fair_queues``)
        # or a shape is numbered (a job of it taken), as nothing else changes it.
        shapes = self._shapes
        if self._waiting is None or self._waiting[0] != len(shapes):
            # (keyed as ``_entry`` numbers them; rebuilt only when one is numbered, so rarely)
            self._waiting = (len(shapes), [(shapes.get(shape, -1), shape[0])
                                           for shape in self._fair.shapes()])
        return self._waiting[1]

    def fair_queues(self) -> TeamQueues:
        """Fair share's per-team queues of this pool state, kept between cycles."""
        self._waiting = None   # the caller syncs them
        if self._fair is None:
            self._fair = TeamQueues()
            self._fair.cursor = self.cursor
        return self._fair
