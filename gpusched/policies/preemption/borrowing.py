"""Teams' usage and borrowing during one preemptor call, without re-ranking a team's jobs
for every question.

A team's running jobs are ranked once (``victim_rules.borrowing_order``) with the sums of GPU milli before
each; the ranking is kept between calls with the index of candidate victims
(``victim_index``), which tells it of the jobs that join or leave the team, and sorted
again only when a call asks for the order after such a change. What a call changes
afterwards is small: the victims it already took (``taken``, dropped from the ranking) and
the milli it booked for the team's beneficiaries (``extra``, counted before every job). So
the milli ranked before a job is its prefix sum, plus ``extra``, less the taken jobs ranked
before it: the cost of a question grows with the victims taken in the call, not with the
team's jobs.
"""
from __future__ import annotations

from typing import AbstractSet, Callable, Mapping, Sequence

from gpusched.core.state import JobState
from gpusched.policies.preemption.victim_rules import above_guarantee, borrowing_order, crosses_guarantee


class TeamRanking:
    """One team's running jobs (``milli``: each one's) and their total; in borrowing order
    with the milli ranked before each (``rank``, ``before``) once asked. Kept between calls
    (``VictimIndex``), it is told of the jobs that join or leave (``add``, ``drop``)."""

    def __init__(self, jobs: Sequence[JobState]) -> None:
        self._jobs = {j.job_id: j for j in jobs}
        self.milli = {j.job_id: j.milli for j in jobs}
        self.total = sum(self.milli.values())
        self._rank: dict[str, int] | None = None
        self.before: list[int] = []

    def add(self, job: JobState) -> None:
        self.drop(job.job_id)
        self._jobs[job.job_id] = job
        self.total += self.milli.setdefault(job.job_id, job.milli)
        self._rank = None

    def drop(self, job_id: str) -> None:
        if self._jobs.pop(job_id, None) is not None:
            self.total -= self.milli.pop(job_id)
            self._rank = None

    @property
    def rank(self) -> dict[str, int]:
        if self._rank is None:
            ordered = sorted(self._jobs.values(), key=borrowing_order)
            self.before = []
            self._rank = {j.job_id: i for i, j in enumerate(ordered)}
            total = 0
            for j in ordered:
                self.before.append(total)
                total += j.milli
        return self._rank


class TeamLedger:
    """Usage and borrowing of every team for one call; ``taken`` and ``extra`` are the
    call's own (``SearchContext``), read as they are at each question."""

    def __init__(self, team_jobs: Mapping[str, list[JobState]], guaranteed: Callable[[str], float],
                 taken: AbstractSet[str], extra: Mapping[str, int],
                 rankings: dict | None = None) -> None:
        self._team_jobs, self._guaranteed = team_jobs, guaranteed
        self._taken, self._extra = taken, extra
        # Rankings depend on the state alone: ``rankings`` keeps them between calls (the
        # ``VictimIndex`` drops a team's when its jobs change).
        self._teams: dict[str, TeamRanking] = {} if rankings is None else rankings
        # team -> [(job id, milli)] of its taken jobs, rebuilt when ``taken`` grows
        self._taken_by_team: dict[str, list[tuple[str, int]]] = {}
        self._taken_seen = -1

    def ranking(self, team: str) -> TeamRanking:
        ranking = self._teams.get(team)
        if ranking is None:
            ranking = self._teams[team] = TeamRanking(self._team_jobs.get(team, ()))
        return ranking

    def _taken_of(self, team: str) -> list[tuple[int, int]]:
        if self._taken_seen != len(self._taken):   # ``taken`` only grows within a call
            self._taken_seen = len(self._taken)
            self._taken_by_team = {}
        found = self._taken_by_team.get(team)
        if found is None:
            ranking = self.ranking(team)
            found = self._taken_by_team[team] = [(j, ranking.milli[j]) for j in self._taken if j in ranking.milli]
        return found

    def held(self, team: str) -> int:
        """GPU milli the team's running jobs hold, less the victims taken in the call."""
        return self.ranking(team).total - sum(m for _, m in self._taken_of(team))

    def _ranked(self, job: JobState) -> bool:
        return job.job_id in self.ranking(job.team).milli and job.job_id not in self._taken

    def milli_before(self, job: JobState) -> int:
        """Milli ranked before ``job`` (ranked) in its team, beneficiaries booked in the
        call first: never below 0."""
        ranking = self.ranking(job.team)
        rank = ranking.rank[job.job_id]
        taken_before = sum(m for j, m in self._taken_of(job.team) if ranking.rank[j] < rank)
        return self._extra.get(job.team, 0) + ranking.before[rank] - taken_before

    def borrowed(self, job: JobState) -> bool:
        """Its milli crosses the team's guarantee, or comes after it (``crosses_guarantee``)."""
        if not self._ranked(job):
            return False
        guarantee = self._guaranteed(job.team)
        # With nothing before it, the job borrows if its own milli crosses: no ranking needed
        # (what is ranked before a job is never below 0).
        return crosses_guarantee(0, job.milli, guarantee) or crosses_guarantee(self.milli_before(job), job.milli,
                                                                                 guarantee)

    def wholly_above(self, job: JobState) -> bool:
        """The team keeps its guarantee without it (and without every job ranked after it)."""
        if not self._ranked(job):
            return False
        guarantee = self._guaranteed(job.team)
        # Above with nothing before it (no guarantee): no ranking needed.
        return above_guarantee(0, guarantee) or above_guarantee(self.milli_before(job), guarantee)
