"""When a running job is a candidate victim (``VictimIndex``): for priority once past its
exempt time and within its budget, for reclaim once past ``reclaim_min_runtime_s`` and not
reclaimed within ``reclaim_window_s``. ``listing`` says which now and, for those not yet,
when; ``Waiting`` holds those due later in a heap by that time, stamped so that a job
changed since is skipped (it was listed afresh then)."""
from __future__ import annotations

import heapq
import math
from typing import Mapping

from gpusched.core.state import JobState
from gpusched.policies.preemption.protection import budget_spent, reclaimed_within, running_since

# Due times are sums of floats; the rule itself is checked when one comes due.
_SLACK_S = 1e-3


def rules(config) -> tuple:
    """What in a ``PreemptionConfig`` decides who is listed."""
    return (config.min_runtime_s, config.min_runtime_growth, config.max_min_runtime_s,
            tuple(sorted(config.pool_min_runtime_s.items())), config.preemption_budget,
            config.reclaim_min_runtime_s, config.reclaim_window_s)


def listing(job: JobState, config, now: float) -> tuple[list[bool], float, float]:
    """Whether ``job`` is listed at ``now`` [for priority, for reclaim], and when it will be
    for each (inf: never; meaningful only where not listed)."""
    since = job.started_at or job.placed_at    # running_since, inlined: every job of a build
    age = now - since
    if config.preemption_budget and budget_spent(job, config.preemption_budget):
        by_priority, priority_due = False, math.inf
    else:
        exempt = config.exempt_s(job)
        by_priority, priority_due = age >= exempt, since + exempt
    recent = job.preempted_reason and reclaimed_within(job, now, config.reclaim_window_s)
    by_reclaim = age >= config.reclaim_min_runtime_s and not recent
    reclaim_due = max(since + config.reclaim_min_runtime_s,
                      job.preempted_at + config.reclaim_window_s if recent else -math.inf)
    return [by_priority, by_reclaim], priority_due, reclaim_due


class Waiting:
    """Jobs not yet listed for priority (kind 0) or reclaim (kind 1), by when they will be."""

    def __init__(self) -> None:
        self._stamp: dict[str, int] = {}             # job -> its latest waiting entries' stamp
        self._stamps = 0
        self._heap: list[tuple[float, int, str, int]] = []   # (due, stamp, job, kind)

    def forget(self, jid: str) -> None:
        """``jid`` changed: its waiting entries are stale."""
        self._stamp.pop(jid, None)

    def wait(self, jid: str, yes: list[bool], priority_due: float, reclaim_due: float) -> None:
        """Note ``jid`` as ``listing`` has it: what it is not listed for, it waits for."""
        self._stamps += 1
        self._stamp[jid] = stamp = self._stamps
        if not yes[0] and priority_due < math.inf:
            heapq.heappush(self._heap, (priority_due, stamp, jid, 0))
        if not yes[1]:
            heapq.heappush(self._heap, (reclaim_due, stamp, jid, 1))

    def come_due(self, now: float, config, jobs: Mapping[str, JobState]) -> list[tuple[str, int]]:
        """The (job, kind) whose exempt time or reclaim window ended by ``now``, taken out."""
        heap, early, out = self._heap, [], []
        while heap and heap[0][0] <= now + _SLACK_S:
            entry = heapq.heappop(heap)
            _, stamp, jid, kind = entry
            if self._stamp.get(jid) != stamp:
                continue   # the job changed since: listed afresh then
            job = jobs[jid]
            age = now - running_since(job)
            if kind == 0:
                due = age >= config.exempt_s(job)
            else:
                due = age >= config.reclaim_min_runtime_s and not reclaimed_within(job, now, config.reclaim_window_s)
            if not due:
                early.append(entry)
                continue
            out.append((jid, kind))
        for entry in early:
            heapq.heappush(heap, entry)
        return out
