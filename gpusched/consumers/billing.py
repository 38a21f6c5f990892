"""GPU-time per team, folded from the pool log: what billing charges, in memory.

Billing must charge what the log says ran, not what was proposed, so it watches the
reducer's outcomes: a job is charged its GPU milli from the moment all its workers run
(``running``) until it stops holding GPUs or ends. Pure: fed (event, job) pairs. The
billing consumer stores the same charges as spans (``gpusched.consumers.records``);
this fold is the reference its database is checked against.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from gpusched.core.model import JobPhase
from gpusched.core.state import JobState

CHARGED = (JobPhase.RUNNING, JobPhase.PREEMPTING, JobPhase.STOPPING)   # held until the processes are gone


@dataclass
class BillingLedger:
    gpu_milli_seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    _open: dict[str, tuple[float, int, str]] = field(default_factory=dict)   # job -> (since, milli, team)

    def observe(self, job: JobState, time: float) -> None:
        """Call after every accepted event that changed ``job``; ``time`` is the event's."""
        running = job.phase in CHARGED
        opened = self._open.get(job.job_id)
        if running and opened is None:
            self._open[job.job_id] = (time, job.milli, job.team)
        elif not running and opened is not None:
            since, milli, team = self._open.pop(job.job_id)
            self.gpu_milli_seconds[team] += milli * max(0.0, time - since)

    def gpu_hours(self, now: float | None = None) -> dict[str, float]:
        """Closed charges, plus open ones up to ``now`` when given."""
        totals = defaultdict(float, self.gpu_milli_seconds)
        if now is not None:
            for since, milli, team in self._open.values():
                totals[team] += milli * max(0.0, now - since)
        return {team: ms / 1000 / 3600 for team, ms in sorted(totals.items())}
