"""``gpusched usage``: GPU-hours allocated vs used per team and pool, and the jobs that
hold GPUs idle, folded from the pool log (allocation) and ``<prefix>usage`` (what the
GPUs did). The fold is ``gpusched.consumers.utilization``; this is its Kafka side.

A usage record that does not decode, or fails its checks, goes to the dead-letter topic
with the reason, and the reader goes on.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import sys
import time

from aiokafka import TopicPartition
from aiokafka.errors import KafkaError

from gpusched.adapters.log.follower import LogFollower
from gpusched.adapters.log.publisher import DeadLetters, EventPublisher
from gpusched.adapters.broker.kafka_admin import TopicNames, wait_for_broker
from gpusched.adapters.broker.kafka_security import KafkaConnection, Where
from gpusched.adapters.broker.topic_reader import Batches, TopicReader
from gpusched.adapters.nodes.usage_records import UsageRecordError, decode_usage
from gpusched.consumers.utilization import (
    DEFAULT_IDLE_AFTER_S, DEFAULT_IDLE_PERCENT, GpuHours, UtilizationLedger, UtilizationReport,
)

log = logging.getLogger(__name__)


class UsageReader:
    """Reads every partition of the usage topic from the beginning into ``ledger``."""

    def __init__(self, bootstrap: Where, topics: TopicNames, ledger: UtilizationLedger,
                 dead_letters: DeadLetters) -> None:
        self.topics = topics
        self.ledger = ledger
        self.folded = 0
        self.dead = 0
        self._bootstrap = bootstrap
        self._dead_letters = dead_letters
        self._reader: TopicReader | None = None
        self._tps: list[TopicPartition] = []
        self._next: dict[TopicPartition, int] = {}   # offset after the last record folded
        self._progress = asyncio.Event()
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        self._reader = TopicReader(self._bootstrap, auto_offset_reset="earliest")
        await self._reader.start()
        # aiokafka (0.14) knows a topic's partitions once its client fetched metadata for it
        parts = await self._reader.partitions(self.topics.usage)
        if not parts:
            raise KafkaError(f"topic {self.topics.usage} has no partitions (does it exist?)")
        self._tps = await self._reader.assign(parts, "beginning")
        self._task = asyncio.create_task(self._run(), name="usage-reader")

    async def _run(self) -> None:
        reader = self._reader
        assert reader is not None, "start() first"
        await reader.run(self._fold_batches, max_records=10_000, on_fetch_error=self._fetch_failed)

    @staticmethod
    async def _fetch_failed(exc: Exception) -> None:
        if not isinstance(exc, KafkaError):
            raise exc
        log.warning("usage fetch failed; retrying", exc_info=exc)
        await asyncio.sleep(0.5)   # back-off before fetching again

    async def _fold_batches(self, batches: Batches) -> None:
        for tp, records in batches.items():
            for record in records:
                await self._fold(record)
            self._next[tp] = records[-1].offset + 1
        self._progress.set()

    async def _fold(self, record) -> None:
        try:
            usage = decode_usage(record.value or b"")
        except UsageRecordError as exc:
            self.dead += 1
            await self._dead_letters.put(record, str(exc))
            return
        self.folded += self.ledger.add(usage)

    async def caught_up(self, timeout: float = 60.0) -> None:
        """Wait until everything on the topic when called has been folded."""
        reader, task = self._reader, self._task
        assert reader is not None and task is not None, "start() first"
        ends = await reader.end_offsets(self._tps)
        async with asyncio.timeout(timeout):
            while any(self._next.get(tp, 0) < end for tp, end in ends.items()):
                if task.done():
                    task.result()   # the reader died: its error, not a timeout
                    raise RuntimeError("the usage reader stopped")
                self._progress.clear()
                progress = asyncio.ensure_future(self._progress.wait())
                await asyncio.wait([progress, task], return_when=asyncio.FIRST_COMPLETED)
                progress.cancel()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._reader is not None:
            await self._reader.stop()


async def collect(bootstrap: Where, topics: TopicNames, ledger: UtilizationLedger, seconds: float = 0.0,
                  name: str = "usage-report", write_dead_letters: bool = False) -> UsageReader:
    """Fold the pool log and the usage topic into ``ledger``: for ``seconds``, then up to
    the end of both as it is then. Returns the reader (its counts).

    A report runs as a read-only principal (audit, billing) by default: records it cannot
    apply are logged and counted (``UsageReader.dead``), not dead-lettered;
    ``write_dead_letters`` (a principal that may write them) sends them to the topic."""
    publisher = EventPublisher(bootstrap, topics, 1) if write_dead_letters else None
    if publisher is not None:
        await publisher.start()
    dead_letters = DeadLetters(publisher, name)

    def on_event(partition, offset, event, outcome, state) -> None:
        if outcome.accepted:
            for job_id in outcome.jobs:
                job = state.jobs.get(job_id)
                if job is not None:
                    ledger.observe(job, event.time)

    follower = LogFollower(bootstrap, topics, name, dead_letters, on_event=on_event)
    reader = UsageReader(bootstrap, topics, ledger, dead_letters)
    try:
        await follower.start()
        await reader.start()
        if seconds:
            await asyncio.sleep(seconds)   # the span the caller asked to follow live
        await follower.caught_up()
        await reader.caught_up()
        return reader
    finally:
        await reader.stop()
        await follower.stop()
        if publisher is not None:
            await publisher.stop()


# --- the command -------------------------------------------------------------------------
def format_report(report: UtilizationReport, ledger: UtilizationLedger, per_job: bool = False) -> str:
    # a short run (the demo, a test) holds far below a GPU-hour: seconds read better then
    unit, scale = ("GPU-hours", 1.0) if report.total.allocated >= 1 else ("GPU-seconds", 3600.0)
    lines = [f"{unit} allocated vs used (used = allocated x measured SM utilization):",
             f"  {'':<28} {'allocated':>11} {'used':>11} {'unmeasured':>11} {'util':>6}"]
    for title, groups in (("team", report.teams), ("pool", report.pools)):
        for name, hours in groups.items():
            lines.append(_row(f"{title} {name}", hours, scale))
    if per_job:
        for job in sorted(report.jobs.values(), key=lambda j: (j.team, j.job_id)):
            lines.append(_row(f"job {job.name or job.job_id}", job.hours, scale))
    lines.append(_row("total", report.total, scale))
    idle = report.idle_jobs
    lines.append(f"jobs holding GPUs below {ledger.idle_percent:g}% SM for {ledger.idle_after_s:g}s or more: "
                 f"{len(idle) or 'none'}")
    for job in idle:
        lines.append(f"  {job.job_id} ({job.name or '?'}), team {job.team}, pool {job.pool}: idle {job.idle_s:.1f}s"
                     f"{' (still idle, still holding GPUs)' if job.idle_now else ''}"
                     f"{'  [simulated]' if job.hours.simulated else ''}")
    if report.unattributed:
        lines.append(f"{report.unattributed} usage records of attempts the log shows holding no GPUs (not counted)")
    if report.total.simulated:
        lines.append("[simulated]: from the usage model of simulated nodes, not NVML")
    return "\n".join(lines)


def _row(label: str, h: GpuHours, scale: float) -> str:
    util = "-" if h.utilization is None else f"{h.utilization:.1%}"
    return (f"  {label:<28} {h.allocated * scale:11.4f} {h.used * scale:11.4f} {h.unmeasured * scale:11.4f}"
            f" {util:>6}{'  [simulated]' if h.simulated else ''}")


def report_json(report: UtilizationReport) -> dict:
    def hours(h: GpuHours) -> dict:
        return {"allocated": h.allocated, "used": h.used, "unmeasured": h.unmeasured,
                "utilization": h.utilization, "simulated": h.simulated}
    return {"teams": {k: hours(v) for k, v in report.teams.items()},
            "pools": {k: hours(v) for k, v in report.pools.items()},
            "total": hours(report.total),
            "jobs": {j.job_id: {"name": j.name, "team": j.team, "pool": j.pool, **hours(j.hours), "idle_s": j.idle_s,
                                "idle": j.idle, "idle_now": j.idle_now} for j in report.jobs.values()},
            "idle_jobs": [j.job_id for j in report.idle_jobs], "unattributed": report.unattributed}


def number_type(low: float, high: float = math.inf, low_open: bool = False):
    """An argparse ``type``: a finite number from ``low`` (excluded with ``low_open``) to
    ``high``; anything else is a usage error quoting the value."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and (low < value if low_open else low <= value) and value <= high):
            bound = f"{'>' if low_open else '>='} {low:g}" + (f" and <= {high:g}" if high < math.inf else "")
            raise argparse.ArgumentTypeError(f"{text!r} is not a number {bound}")
        return value
    return parse


def parser() -> argparse.ArgumentParser:
    from gpusched.config import KafkaSettings

    p = argparse.ArgumentParser(prog="gpusched usage", description=main.__doc__)
    KafkaSettings.add_args(p)
    # a report on stdout: the followers' progress lines only when asked for
    p.set_defaults(log_level=p.get_default("log_level") or "WARNING")
    p.add_argument("--seconds", type=number_type(0.0), default=0.0,
                   help="follow the topics this long before reporting (default: report what they hold now)")
    p.add_argument("--idle-percent", type=number_type(0.0, 100.0), default=DEFAULT_IDLE_PERCENT,
                   help="a GPU below this SM utilization is idle")
    p.add_argument("--idle-after", type=number_type(0.0, low_open=True), default=DEFAULT_IDLE_AFTER_S,
                   help="seconds a job's GPUs must stay idle before it is flagged")
    p.add_argument("--connect-timeout", type=number_type(0.0, low_open=True), default=15.0,
                   help="seconds to wait for the broker")
    p.add_argument("--jobs", action="store_true", help="a line per job too")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    return p


async def _run(args: argparse.Namespace) -> int:
    from gpusched.config import kafka_settings

    settings = kafka_settings(args)
    conn, topics = KafkaConnection.from_settings(settings), TopicNames(settings.topic_prefix)
    client_log = logging.getLogger("aiokafka")
    level = client_log.level
    client_log.setLevel(logging.CRITICAL)   # one clear line below, not a connection error a try
    try:
        await wait_for_broker(conn, args.connect_timeout)
    except TimeoutError as exc:
        print(f"gpusched usage: {exc}", file=sys.stderr)
        return 1
    finally:
        client_log.setLevel(level)
    missing = await missing_topics(conn, topics)
    if missing:
        print(f"gpusched usage: no topic {', '.join(missing)} on {conn} "
              f"(wrong --topic-prefix, or no cluster has run there)", file=sys.stderr)
        return 1
    ledger = UtilizationLedger(args.idle_percent, args.idle_after)
    await collect(conn, topics, ledger, args.seconds)
    report = ledger.report(now=time.time())
    print(json.dumps(report_json(report), indent=2) if args.json else format_report(report, ledger, args.jobs))
    return 0


async def missing_topics(bootstrap: Where, topics: TopicNames) -> list[str]:
    async with TopicReader(bootstrap) as reader:
        present = await reader.topics()
    return [t for t in (topics.events, topics.usage) if t not in present]


def main(argv: list[str] | None = None) -> int:
    """``gpusched usage``: GPU-hours allocated vs used per team and pool, and idle jobs."""
    args = parser().parse_args(argv)
    try:
        return asyncio.run(_run(args))
    except KeyboardInterrupt:
        return 130
    except (KafkaError, OSError, TimeoutError) as exc:   # the broker went away mid-way
        print(f"gpusched usage: {exc!r}", file=sys.stderr)
        return 1
