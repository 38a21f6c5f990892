"""Whether a round's searches (the ``preempt`` and ``defrag`` actions) can propose anything
at all, told without them: most rounds of a burst of one class of jobs cannot, and the
searches place every pending job to learn it (``preemption_decisions``).

Every victim either search may take is RUNNING or PLACED and ``preemptible``
(``victim_rules``, ``defrag``), and besides

* for priority: of a class strictly lower than its pending job's;
* for reclaim: borrowed capacity, which only a quota tree with guarantees knows;
* for a move (defrag): checkpointable, of its pending job's class or lower.

So where no pending job outranks a possible victim, no quota tree has guarantees and no
possible victim of a pending job's class or lower is checkpointable, both searches
propose nothing, and the round runs the other actions only. The possible victims of a
state are kept between rounds through its journal of changed jobs
(``JournalCursor``), so a round reads what changed, not every job.
"""
from __future__ import annotations

import math
from collections import Counter

from gpusched.core.model import JobPhase
from gpusched.core.priority import priority_value
from gpusched.core.state import ClusterState, JobState
from gpusched.policies.journal_cursor import JournalCursor
from gpusched.policies.queueing.quota import QueueTree

SEARCHES = frozenset({"preempt", "defrag"})   # the actions that look for victims
HOLDING = (JobPhase.RUNNING, JobPhase.PLACED)


class PossibleVictims:
    """The preemptible RUNNING or PLACED jobs of one state, counted by class."""

    def __init__(self) -> None:
        self.cursor = JournalCursor()
        self.jobs: dict[str, tuple[int, bool]] = {}   # job -> (class, checkpointable)
        self.classes: Counter[int] = Counter()        # class -> possible victims of it
        self.movable: Counter[int] = Counter()        # the same, checkpointable ones only

    def refresh(self, state: ClusterState) -> None:
        changed = self.cursor.read(state)
        if changed is None:   # another state, or changes dropped unread: count afresh
            self.jobs.clear()
            self.classes.clear()
            self.movable.clear()
            changed = list(state.jobs)
        for job_id in changed:
            self._note(job_id, state.jobs.get(job_id))

    def _note(self, job_id: str, job: JobState | None) -> None:
        old = self.jobs.pop(job_id, None)
        if old is not None:
            _take(self.classes, old[0])
            if old[1]:
                _take(self.movable, old[0])
        if job is None or job.phase not in HOLDING or not job.spec.preemptible:
            return
        new = (priority_value(job.spec.priority_class), job.spec.checkpoint_interval_s > 0)
        self.jobs[job_id] = new
        self.classes[new[0]] += 1
        if new[1]:
            self.movable[new[0]] += 1

    def searches_can_propose(self, state: ClusterState, guarantees: bool) -> bool:
        """False only where neither search can propose anything this round (see the
        module's doc); ``guarantees``: the round's quota tree has some."""
        self.refresh(state)
        if not state.pending or not self.classes:
            return False
        if guarantees:
            return True
        lowest, lowest_movable = min(self.classes), min(self.movable, default=math.inf)
        jobs = state.jobs
        for job_id in state.pending:
            job = jobs.get(job_id)
            if job is not None:
                mine = priority_value(job.spec.priority_class)
                if mine > lowest or mine >= lowest_movable:
                    return True
        return False


def has_guarantees(tree: QueueTree) -> bool:
    """Whether any team or org of the tree has a guarantee: only then is capacity borrowed."""
    return tree.has_guarantees or any(org.guaranteed_milli for org in tree.orgs.values())


def _take(counts: Counter, key: int) -> None:
    counts[key] -= 1
    if not counts[key]:
        del counts[key]
