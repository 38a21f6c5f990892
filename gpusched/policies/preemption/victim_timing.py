"""The running jobs not yet candidate victims of the index (``VictimIndex``) by when they
will be: ``victim_rules.victim_listing`` (the rule's clock half: for priority once past
the exempt time and within the budget, for reclaim once ``reclaim_ready``) says which a
job is now and, for those not yet, when; ``Waiting`` holds those due later in a heap by
that time, stamped so that a job changed since is skipped (it was listed afresh then),
and asks the rule again when one comes due."""
from __future__ import annotations

import heapq
import math
from typing import Mapping

from gpusched.core.state import JobState
from gpusched.policies.preemption.victim_rules import past_exempt, reclaim_ready

# Due times are sums of floats; the rule itself is checked when one comes due.
_SLACK_S = 1e-3


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
        """Note ``jid`` as ``victim_listing`` has it: what it is not listed for, it waits for."""
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
            due = past_exempt(job, config, now) if kind == 0 else reclaim_ready(job, config, now)
            if not due:
                early.append(entry)
                continue
            out.append((jid, kind))
        for entry in early:
            heapq.heappush(heap, entry)
        return out
