"""Whether a round's searches (the ``preempt`` and ``defrag`` actions) can propose anything
at all, told without them: most rounds of a burst of one class of jobs cannot, and the
searches place every pending job to learn it (``preemption_decisions``).

Every victim either search may take ``may_be_victim`` (``victim_rules``), and besides

* for priority: its class is ``lower_class`` than its pending job's;
* for reclaim: borrowed capacity, which only a quota tree with guarantees knows;
* for a move (defrag): it ``may_ever_move`` and is of a ``movable_class``.

The class rules are monotone (a class a pending job may take, a higher one may take
too), so the lowest class of the possible victims (and of the movable ones) answers for
all. So where no pending job may take the lowest possible victim's class for priority, no
quota tree has guarantees and no pending job may move the lowest movable one, both searches
propose nothing, and the round runs the other actions only. The possible victims of a
state are kept between rounds through its journal of changed jobs
(``JournalCursor``), so a round reads what changed, not every job.
"""
from __future__ import annotations

import math
from collections import Counter

from gpusched.core.priority import priority_value
from gpusched.core.state import ClusterState, JobState
from gpusched.policies.journal_cursor import JournalCursor
from gpusched.policies.queueing.quota import QueueTree
from gpusched.policies.preemption.victim_rules import lower_class, may_be_victim, may_ever_move, movable_class

SEARCHES = frozenset({"preempt", "defrag"})   # the actions that look for victims


class PossibleVictims:
    """The jobs of one state that ``may_be_victim``, counted by class."""

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
        if job is None or not may_be_victim(job):
            return
        new = (priority_value(job.spec.priority_class), may_ever_move(job))
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
                if lower_class(lowest, mine) or movable_class(lowest_movable, mine):
                    return True
        return False


def has_guarantees(tree: QueueTree) -> bool:
    """Whether any team or org of the tree has a guarantee: only then is capacity borrowed."""
    return tree.has_guarantees or any(org.guaranteed_milli for org in tree.orgs.values())


def _take(counts: Counter, key: int) -> None:
    counts[key] -= 1
    if not counts[key]:
        del counts[key]
