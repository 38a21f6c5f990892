"""Abuse limits of admission: a per-team submission rate (token bucket) and a cap on a
team's pending jobs (Slurm's ``MaxSubmitJobs``), each refused with ``RESOURCE_EXHAUSTED``
naming the limit. Per replica for the rate (as any API gateway's); the pending count is
the folded state's, so every replica counts the same jobs."""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

import grpc

from gpusched.adapters.api.grpc_server import RequestRefused
from gpusched.core.model import JobPhase
from gpusched.core.state import ClusterState

_PENDING = JobPhase.PENDING


@dataclass(slots=True)
class TokenBucket:
    """``rate`` tokens a second up to ``burst``; ``take`` spends ``n`` or none."""

    rate: float
    burst: float
    tokens: float = 0.0
    at: float = 0.0

    def take(self, n: int, now: float) -> float:
        """0.0 when taken; else the seconds until ``n`` tokens are there."""
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if n <= self.tokens:
            self.tokens -= n
            return 0.0
        return (n - self.tokens) / self.rate if self.rate > 0 else float("inf")


class PendingCounts:
    """Pending jobs per team over every partition, kept up to date from the outcomes the
    follower folds (``note``) instead of a scan of every pending job per submission.
    A partition whose state object was replaced (a snapshot restored) is recounted."""

    def __init__(self) -> None:
        self._kept: dict[int, tuple[ClusterState, dict[str, str], Counter]] = {}

    def note(self, partition: int, state: ClusterState, job_ids) -> None:
        kept = self._kept.get(partition)
        if kept is None or kept[0] is not state:
            return   # counted from scratch at the next ``count``
        _, teams, counts = kept
        for job_id in job_ids:
            job = state.jobs.get(job_id)
            pending = job is not None and job.phase is _PENDING
            team = teams.get(job_id)
            if pending and team is None:
                teams[job_id] = job.spec.team
                counts[job.spec.team] += 1
            elif not pending and team is not None:
                del teams[job_id]
                counts[team] -= 1

    def count(self, states: dict[int, ClusterState], team: str) -> int:
        total = 0
        for partition, state in states.items():
            kept = self._kept.get(partition)
            if kept is None or kept[0] is not state:
                teams = {j: state.jobs[j].spec.team for j in state.pending}
                kept = self._kept[partition] = (state, teams, Counter(teams.values()))
            total += kept[2][team]
        return total


@dataclass
class SubmissionLimits:
    """``rate``/``burst``: jobs a second a team may submit (0: no limit); ``max_pending``:
    pending jobs a team may have (0: no limit)."""

    rate: float = 0.0
    burst: float = 0.0
    max_pending: int = 0
    pending: PendingCounts = field(default_factory=PendingCounts)
    _buckets: dict[str, TokenBucket] = field(default_factory=dict)

    def check(self, new_by_team: Counter, states: dict[int, ClusterState], jobs_by_team: Counter | None = None) -> None:
        """Raise ``RequestRefused`` (RESOURCE_EXHAUSTED) when a team would pass a limit:
        ``new_by_team`` submissions (the rate), ``jobs_by_team`` the jobs they make (an
        array's tasks count each; default: one a submission)."""
        for team, n in sorted(new_by_team.items()):
            if self.max_pending:
                pending = self.pending.count(states, team)
                if pending + (jobs_by_team or new_by_team)[team] > self.max_pending:
                    raise RequestRefused(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                         f"spec.team: team {team!r} has {pending} pending jobs; the limit "
                                         f"(--max-pending-per-team) is {self.max_pending}")
        if not self.rate:
            return
        now = time.monotonic()
        for team, n in sorted(new_by_team.items()):
            bucket = self._buckets.get(team)
            if bucket is None:
                bucket = self._buckets[team] = TokenBucket(self.rate, max(self.burst, 1.0), max(self.burst, 1.0), now)
            wait = bucket.take(n, now)
            if wait:
                raise RequestRefused(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                     f"spec.team: team {team!r} is over the submission rate limit "
                                     f"(--submit-rate {self.rate:g}/s, --submit-burst {self.burst:g}); "
                                     f"retry in {wait:.2f}s")
