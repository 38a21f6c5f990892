"""How far each team list of fair share's queues (``fair_queue``) is known to hold only
jobs the cursor's round has tested (``cursor``), so that a continued cycle jumps there.

Past the head, a continued cycle leaves out the jobs its round tested; they sit at the
front of every team's list, so a walk that checks them one by one costs the round's
progress (up to the whole queue) every cycle. Each list keeps a *bound* instead:

* every entry of the list below the bound, but for the bound's *exceptions*, is dead or
  of a job the round tested (and, while it does not hold a reservation, left out);
* an entry entered below the bound (a new job, a job that aged, an id back as another
  job) is an exception, and so is, for a cycle, that of a job that held a reservation
  in the last (it is tested again, ``cursor``);
* a walk that reaches the bound's place while leaving out tested jobs moves the bound
  over every dead or tested entry it passes there; a round that ends drops every bound.

So the walk from a place below the bound takes the exceptions there, then goes on at the
bound: the jobs it produces are those of the walk that checks every entry.
"""
from __future__ import annotations

from bisect import bisect_left, insort
from typing import AbstractSet, Mapping

from gpusched.core.state import JobState
from gpusched.policies.queueing.cursor import JobTestCursor

END = (float("inf"),)   # above any entry: every entry of the list is below


class Bound:
    """One list's bound: the entry it is at (``END``: past the last), and its exceptions
    below it, sorted."""

    __slots__ = ("entry", "exceptions")

    def __init__(self, entry: tuple, exceptions: list) -> None:
        self.entry, self.exceptions = entry, exceptions


class TestedBounds:
    """The bounds of one ``TeamQueues``' lists, by (young, team)."""

    __slots__ = ("_round", "_cycle", "_bounds")

    def __init__(self) -> None:
        self._round = -1
        self._cycle = -1   # the cycle whose reserved jobs are exceptions
        self._bounds: dict[tuple[bool, str], Bound] = {}

    def clear(self) -> None:
        self._bounds = {}
        self._cycle = -1

    def done(self, cursor: JobTestCursor, members: Mapping[str, tuple],
             jobs: Mapping[str, JobState]) -> AbstractSet[str] | None:
        """The jobs this cycle leaves out once it may jump (else None); on a cycle's first
        call, the bounds of a new round are dropped and the reserved jobs made exceptions."""
        if not cursor.skimming:
            return None
        if cursor.cycle != self._cycle:
            self._cycle = cursor.cycle
            if cursor.round != self._round:
                self._round, self._bounds = cursor.round, {}
            for job_id in cursor.reserved:
                entry = members.get(job_id)
                if entry is not None:
                    self.entered(len(entry) == 3, jobs[job_id].team, entry)
        return cursor.done

    def entered(self, young: bool, team: str, entry: tuple) -> None:
        """``entry`` is in its list now (or tested again): an exception if below the bound."""
        bound = self._bounds.get((young, team))
        if bound is not None and entry < bound.entry:
            exceptions = bound.exceptions
            i = bisect_left(exceptions, entry)
            if not any(e is entry for e in exceptions[i:i + 2]):
                insort(exceptions, entry)

    def enter(self, young: bool, team: str, entries: list, i: int, members: Mapping[str, tuple],
              done: AbstractSet[str]) -> tuple[int, Bound | None, list]:
        """A walk of ``entries`` at ``i`` starts leaving out the tested jobs: where it goes on,
        the bound it moves (None: not at the bound), and the exceptions it takes first."""
        bound = self._bounds.get((young, team))
        if bound is None:
            bound = self._bounds[(young, team)] = Bound(entries[0], [])
        at = bisect_left(entries, bound.entry) if bound.entry is not END else len(entries)
        if at >= i:
            exceptions = bound.exceptions
            # Exceptions that are dead or tested left out now are like any entry below the bound.
            exceptions[:] = [e for e in exceptions if members.get(e[-1]) is e and e[-1] not in done]
            return at, bound, exceptions[bisect_left(exceptions, entries[i]):] if i < len(entries) else []
        # The walk passed the bound before leaving out tested jobs (the head): the bound
        # follows only if every entry between was dead or tested.
        while at < i:
            entry = entries[at]
            if members.get(entry[-1]) is entry and entry[-1] not in done:
                return i, None, []
            at += 1
        bound.entry = entries[i] if i < len(entries) else END
        return i, bound, []

    @staticmethod
    def step(bound: Bound, entries: list, i: int, members: Mapping[str, tuple], done: AbstractSet[str]) -> Bound | None:
        """A walk at the bound passed ``entries[i - 1]``: the bound moves over it if it is dead
        or left out as tested, else stays there for the rest of the cycle (None)."""
        entry = entries[i - 1]
        job_id = entry[-1]
        if members.get(job_id) is entry and job_id not in done:
            return None
        bound.entry = entries[i] if i < len(entries) else END
        return bound
