"""GPU-time per team, folded from the pool log: the billing consumer's core.

Billing must charge what the log says ran, not what was proposed, so it watches the
reducer's outcomes: a job is charged its GPU milli from the moment all its workers run
(``running``) until it stops holding GPUs or ends. Pure: fed (event, job) pairs.
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


async def _report(args) -> None:
    import asyncio
    import time

    from gpusched.adapters.follower import FollowerOptions, LogFollower
    from gpusched.adapters.kafka_admin import TopicNames
    from gpusched.adapters.kafka_security import KafkaConnection
    from gpusched.adapters.publisher import DeadLetters
    from gpusched.config import kafka_settings

    settings = kafka_settings(args)
    ledger = BillingLedger()

    def on_event(partition, offset, event, outcome, state):
        if outcome.accepted:
            for job_id in outcome.jobs:
                ledger.observe(state.jobs[job_id], event.time)

    # Billing reads only (its Kafka principal may not write): no producer.
    follower = LogFollower(KafkaConnection.from_settings(settings), TopicNames(settings.topic_prefix), "billing",
                           DeadLetters(None, "billing"),
                           FollowerOptions(freeze_state=True, parallel_replay_min=settings.parallel_replay_min),
                           on_event=on_event)
    await follower.start()
    try:
        while True:
            await follower.caught_up()
            print(f"GPU-hours per team at {time.strftime('%Y-%m-%d %H:%M:%S')}:")
            for team, hours in ledger.gpu_hours(now=time.time()).items():
                print(f"  {team:<24} {hours:12.4f}")
            if not args.follow:
                return
            await asyncio.sleep(args.follow)   # report period
    finally:
        await follower.stop()


def main(argv: list[str] | None = None) -> int:
    """``gpusched billing``: GPU-hours per team, from the log (all pools)."""
    import argparse
    import asyncio

    from gpusched.config import KafkaSettings

    parser = argparse.ArgumentParser(prog="gpusched billing", description=main.__doc__)
    KafkaSettings.add_args(parser)
    parser.add_argument("--follow", type=float, default=0.0, help="keep reporting every N seconds")
    asyncio.run(_report(parser.parse_args(argv)))
    return 0
