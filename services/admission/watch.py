"""Fan-out of job changes to WatchJobs streams, with a bound per watcher."""
from __future__ import annotations

import asyncio

from gpusched.adapters.api.views import job_message
from gpusched.core.state import JobState
from gpusched.v1 import admission_pb2

QUEUE_BOUND = 10_000


class Watchers:
    def __init__(self) -> None:
        self._queues: dict[asyncio.Queue, tuple[str, str, str, frozenset[str] | None]] = {}

    def subscribe(self, team: str, job_id: str, pool: str, teams: frozenset[str] | None = None) -> asyncio.Queue:
        """``teams``: the only teams whose jobs this watcher may see (None: every team)."""
        queue: asyncio.Queue = asyncio.Queue(QUEUE_BOUND)
        self._queues[queue] = (team, job_id, pool, teams)
        return queue

    def unsubscribe(self, queue: asyncio.Queue) -> None:
        self._queues.pop(queue, None)

    def matches(self, queue: asyncio.Queue, job: JobState) -> bool:
        team, job_id, pool, teams = self._queues.get(queue, ("", "", "", frozenset()))
        return (not team or team == job.team) and (not job_id or job_id == job.job_id) \
            and (not pool or pool == job.spec.pool) and (teams is None or job.team in teams)

    def publish(self, job: JobState, event_type: str, offset: int) -> None:
        if not self._queues:
            return
        update = None
        for queue in list(self._queues):
            if not self.matches(queue, job):
                continue
            if update is None:
                update = admission_pb2.JobUpdate(job=job_message(job), event_type=event_type, offset=offset)
            if queue.full():
                # A stalled client must not grow memory without bound: end its stream.
                self.unsubscribe(queue)
                queue.get_nowait()
                queue.put_nowait(None)
            else:
                queue.put_nowait(update)
