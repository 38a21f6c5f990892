"""Read a pool log back and check docs/design/architecture.md's invariants on it.

The services are not trusted: the log is replayed here, and after every event the
allocations are recomputed from scratch from the jobs that hold GPUs and compared with
each node's capacity. What the node-agents reported (started/finished) is checked too.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from aiokafka import AIOKafkaConsumer, TopicPartition

from gpusched.adapters.log import codec
from gpusched.adapters.broker.kafka_admin import TopicNames
from gpusched.adapters.broker.kafka_security import client_args
from gpusched.core import events as ev
from gpusched.core.mig import parse_profile
from gpusched.core.reducer import apply
from gpusched.core.state import ClusterState
from gpusched.v1 import events_pb2
from tests.polling import eventually_async


async def read_log(bootstrap: str, topics: TopicNames, topic: str | None = None,
                   whole: bool = False) -> dict[int, list]:
    """Every record of every partition, as (offset, value) lists keyed by partition
    (``whole``: the records themselves, with their keys and headers)."""
    topic = topic or topics.events
    consumer = AIOKafkaConsumer(**client_args(bootstrap), enable_auto_commit=False)
    await consumer.start()
    try:
        parts = consumer.partitions_for_topic(topic)
        if not parts:
            await consumer._client.force_metadata_update()
            parts = consumer._client.cluster.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        out: dict[int, list] = {tp.partition: [] for tp in tps}
        remaining = {tp for tp in tps if ends[tp] > 0}
        while remaining:
            batches = await consumer.getmany(*remaining, timeout_ms=1000)
            for tp, records in batches.items():
                out[tp.partition].extend(r if whole else (r.offset, r.value) for r in records)
                if records and records[-1].offset >= ends[tp] - 1:
                    remaining.discard(tp)
        return out
    finally:
        await consumer.stop()


async def dead_letters(conn, topics: TopicNames, source: str, count: int, timeout: float = 60.0) -> dict[int, str]:
    """The dead letters of records of topic ``source`` (offset -> reason), once there are
    ``count``; AssertionError at the deadline."""
    async def written():   # polls the topic: the relay and the placer write letters asynchronously
        letters = [events_pb2.DeadLetter.FromString(v)
                   for vs in (await read_log(conn, topics, topics.dead_letters)).values() for _, v in vs]
        found = {letter.offset: letter.reason for letter in letters if letter.source_topic == source}
        return len(found) >= count and found
    return await eventually_async(written, f"{count} dead letters of {source}", timeout, poll=0.2)


@dataclass
class LogReport:
    states: dict[int, ClusterState] = field(default_factory=dict)
    events: int = 0
    undecodable: int = 0
    rejected_placements: int = 0
    violations: list[str] = field(default_factory=list)
    placements: dict[tuple[str, int], int] = field(default_factory=lambda: defaultdict(int))

    def jobs(self):
        for s in self.states.values():
            yield from s.jobs.values()


def check_log(log: dict[int, list]) -> LogReport:
    report = LogReport()
    for partition, records in log.items():
        state = report.states[partition] = ClusterState()
        running: dict[tuple[str, int, int], list] = {}   # worker -> GPU slots reported running
        for offset, value in records:
            try:
                event, _ = codec.decode(value)
            except codec.DecodeError:
                report.undecodable += 1
                continue
            report.events += 1
            outcome = apply(state, event)
            if isinstance(event, ev.JobPlaced):
                if outcome.accepted:
                    report.placements[(event.job_id, event.attempt)] += 1
                else:
                    report.rejected_placements += 1
            _check_capacity(state, f"p{partition}@{offset}", report.violations)
            if outcome.accepted:
                _track_reported(state, event, outcome, running, f"p{partition}@{offset}", report.violations)
    for key, count in report.placements.items():
        if count > 1:
            report.violations.append(f"job {key[0]} attempt {key[1]} placed {count} times")
    return report


def _check_capacity(state: ClusterState, where: str, violations: list[str]) -> None:
    milli: dict[tuple[str, int], int] = defaultdict(int)
    mig: dict[tuple[str, int], int] = defaultdict(int)
    cpu: dict[str, int] = defaultdict(int)
    for job in state.jobs.values():
        if not job.phase.holds_gpus:
            continue
        if len(job.workers) != job.spec.workers:
            violations.append(f"{where}: gang {job.job_id} holds {len(job.workers)}/{job.spec.workers} workers")
        for w in job.workers:
            cpu[w.node] += job.spec.resources.cpu_milli
            for s in w.gpus:
                if s.mig_profile:
                    mask = parse_profile(s.mig_profile).mask(s.mig_start)
                    if mig[(w.node, s.index)] & mask:
                        violations.append(f"{where}: MIG overlap on {w.node}/{s.index}")
                    mig[(w.node, s.index)] |= mask
                else:
                    milli[(w.node, s.index)] += s.milli
    for (node, index), used in milli.items():
        if used > 1000 or (used and mig[(node, index)]):
            violations.append(f"{where}: GPU {node}/{index} allocated {used} milli")
    for node, used in cpu.items():
        if used > state.nodes[node].info.cpu_milli:
            violations.append(f"{where}: node {node} CPU over capacity")


def _track_reported(state, event, outcome, running, where, violations) -> None:
    """What the agents said ran: no GPU may carry more than it holds at any point.

    ``running`` maps (job, attempt, worker) to the GPU slots an agent reported started.
    An interval ends with the agent's WorkerFinished, or when the log takes the work
    away (cancel, requeue), which is the event the agent stops the worker on."""
    if isinstance(event, ev.WorkerStarted):
        job = state.jobs[event.job_id]
        slots = [(w.node, s.index, s.milli) for w in job.workers if w.worker == event.worker for s in w.gpus]
        running[(event.job_id, event.attempt, event.worker)] = slots
    elif isinstance(event, ev.WorkerFinished):
        running.pop((event.job_id, event.attempt, event.worker), None)
    for job_id in outcome.jobs:
        job = state.jobs[job_id]
        for key in [k for k in running if k[0] == job_id]:
            if key[1] != job.attempt or not job.phase.holds_gpus:
                del running[key]
    attempts: dict[str, set[int]] = defaultdict(set)
    for job_id, attempt, _ in running:
        attempts[job_id].add(attempt)
    for job_id, live in attempts.items():
        if len(live) > 1:
            violations.append(f"{where}: job {job_id} runs attempts {sorted(live)} at once")
    load: dict[tuple[str, int], int] = defaultdict(int)
    for slots in running.values():
        for node, index, milli in slots:
            load[(node, index)] += milli
    for gpu, milli in load.items():
        if milli > 1000:
            violations.append(f"{where}: agents report {milli} milli running on {gpu[0]}/{gpu[1]}")
