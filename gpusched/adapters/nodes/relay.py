"""The relay: node-agents' reports into the pool log, each checked against the node that
wrote it (docs/reference/kafka-security.md, "What a node-agent can still forge").

Each agent writes its events to ``<prefix>reports.<node>``, a topic only its own principal
may write, so the topic name is the writer's identity, authenticated by the broker. A node
host writes the reports of all its simulated nodes to ``<prefix>hostreports.<host>``, each
record naming its node in a header; the relay lets it speak only for nodes ``<host>-...``. The
relay consumes every report topic in the consumer group ``<prefix>relay`` (replicas split
the topics; a pattern subscription finds new nodes' topics within ``METADATA_MAX_AGE_MS``),
checks each event with ``check_report`` against the state its ``LogFollower`` folded, and
appends what passes to the pool log, keeping the agent's event id. Usage records (marked
by their ``KIND_HEADER``) go to ``<prefix>usage`` instead, if they are about the node whose
topic they came on. What fails goes to the dead-letter topic with the reason; the relay
goes on.

Ordering: an agent reports only about what it saw in the log, so before refusing a report
the relay waits until its fold covers the log as it was when the report's batch was read
(``_fold_caught_up``, one ListOffsets request for the batch) and checks it again: a
WorkerStarted is never refused for a state without its JobPlaced. A report that passes on
the fold as it is goes on without that wait: the check is about ownership only (a node's
worker of an attempt, a registered node), which a later event never makes untrue of an
earlier log, and whether the report is still current is the reducer's call once it is
appended after everything before it. Reports on the jobs the fold already placed (the
agents read them from work views written from this same fold) cost no request.

At least once, idempotent: a batch's offsets are committed only after the pool log
acknowledged every event of it. A relay killed before that leaves them uncommitted and
the next one (or another replica) reads them again; an event whose id the fold has seen
is skipped, and one appended twice anyway is dropped by the reducer (same id). So the
commit may trail: the offsets of every batch relayed within ``COMMIT_INTERVAL_S`` go in
one commit (a stop commits what is left), not one commit request per batch, which at a
few reports a second meant one per report.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import NamedTuple

from aiokafka import TopicPartition

from gpusched.adapters.log import codec
from gpusched.adapters.log.follower import LogFollower
from gpusched.adapters.log.publisher import DeadLetters, EventPublisher, Position, partition_for
from gpusched.adapters.broker.kafka_admin import TopicNames
from gpusched.adapters.broker.kafka_security import Where
from gpusched.adapters.nodes.reports import HOST_REPORTS, KIND_HEADER, USAGE_KIND, check_report, check_usage_node, \
    hosted_node, node_of_topic, report_pattern
from gpusched.adapters.broker.topic_reader import TopicReader
from gpusched.adapters.nodes.usage_records import UsageRecordError, decode_usage
from gpusched.core import events as ev
from gpusched.core.state import ClusterState

log = logging.getLogger("gpusched.relay")
# How soon a new node's report topic is seen (the pattern is matched against metadata,
# refreshed this often): a new agent's registration waits at most about this long.
METADATA_MAX_AGE_MS = 1000
MAX_RECORDS = 500
# aiokafka keeps one fetch in flight per broker, and a partition whose records were just
# handed out is not in it: that partition's next report waits until the fetch of the
# others returns, up to this long. With the default 500 ms a quiet cluster's reports
# (a WorkerStarted, then its WorkerFinished) would wait that long; 20 ms bounds the wait
# at the cost of at most 50 empty fetches a second when no node reports.
FETCH_MAX_WAIT_MS = 20
# The most a commit trails the reports relayed: what a relay killed -9 makes its successor
# read again (each skipped as seen, or dropped by the reducer as a duplicate).
COMMIT_INTERVAL_S = 0.5


class Relay:
    def __init__(self, bootstrap: Where, topics: TopicNames, partitions: int, follower: LogFollower,
                 publisher: EventPublisher, dead_letters: DeadLetters, name: str) -> None:
        self.topics = topics
        self.partitions = partitions
        self.follower = follower          # folds every partition of the pool log
        self.publisher = publisher
        self.dead_letters = dead_letters
        self.name = name
        self.counts = {"relayed": 0, "refused": 0, "seen": 0, "usage": 0, "commits": 0, "end_asks": 0}
        self._bootstrap = bootstrap
        self._reports: TopicReader | None = None
        # Asks the pool log's end offsets. A client of its own: on a connection that also
        # carries a long-polling fetch (the follower's, the reports'), the broker would
        # answer it only after that fetch returns.
        self._ends: TopicReader | None = None
        self._task: asyncio.Task | None = None
        self._committing: asyncio.Task | None = None   # commits what is relayed, one at a time
        self._uncommitted: dict[TopicPartition, int] = {}   # relayed, acknowledged, not committed
        self._committed_at = 0.0                           # time.monotonic() of the last commit
        self._batch_covered = False   # the fold covers the log as it was when this batch was read

    async def start(self) -> None:
        self._reports = TopicReader(
            self._bootstrap, group_id=self.topics.prefix + "relay", client_id=self.name,
            auto_offset_reset="earliest", metadata_max_age_ms=METADATA_MAX_AGE_MS,
            fetch_max_wait_ms=FETCH_MAX_WAIT_MS,
            session_timeout_ms=10_000, heartbeat_interval_ms=1_000, rebalance_timeout_ms=10_000,
        )
        self._ends = TopicReader(self._bootstrap, client_id=f"{self.name}-ends")
        await self._ends.start()
        await self._reports.start()
        self._reports.subscribe(pattern=report_pattern(self.topics.prefix))
        self._task = asyncio.create_task(self._run(), name=f"relay-{self.name}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._committing is not None:   # no wait for the interval: commit what is left now
            self._committing.cancel()
            await asyncio.gather(self._committing, return_exceptions=True)
        if self._uncommitted and self._reports is not None:
            await self._commit_relayed()
        for reader in (self._reports, self._ends):
            if reader is not None:
                await reader.stop()

    async def _run(self) -> None:
        await self._reports.run(self._relay_or_rewind, max_records=MAX_RECORDS, on_fetch_error=self._failed)

    async def _relay_or_rewind(self, batches: dict) -> None:
        try:
            await self._relay_batches(batches)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            await self._failed(exc)

    async def _failed(self, exc: Exception) -> None:
        # Nothing of the failed batch is committed: read it again from the last
        # commit (what was appended meanwhile is skipped or dropped as a duplicate).
        log.error("%s: relaying failed; reading the reports again", self.name, exc_info=exc)
        await asyncio.sleep(0.5)
        await self._rewind()

    async def _fold_caught_up(self, timeout: float = 120.0) -> None:
        """Wait until the fold covers every partition of the pool log as it is now."""
        tps = [TopicPartition(self.topics.events, p) for p in self.follower.states]
        self.counts["end_asks"] += 1
        for tp, end in (await self._ends.end_offsets(tps)).items():
            if end > 0:
                await self.follower.wait_applied(Position(tp.partition, end - 1), timeout)

    async def _relay_batches(self, batches: dict) -> None:
        """Relay every record fetched; once the pool log acknowledged every event appended,
        their offsets are committed (with those of the other batches of the interval)."""
        acks = []
        self._batch_covered = False
        for tp, records in batches.items():
            host = node_of_topic(self.topics.prefix, tp.topic, HOST_REPORTS)
            node = "" if host else node_of_topic(self.topics.prefix, tp.topic)
            for record in records:
                ack = await self._relay_hosted(host, record) if host else await self._relay(node, record)
                if ack is not None:
                    acks.append(ack)
        await asyncio.gather(*acks)
        # The commit goes on while the next batches are read and relayed.
        self._uncommitted.update((tp, records[-1].offset + 1) for tp, records in batches.items())
        if self._committing is None or self._committing.done():
            self._committing = asyncio.create_task(self._commit_soon())

    async def _commit_soon(self) -> None:
        """Commit what is relayed, at most once per ``COMMIT_INTERVAL_S``, until all is."""
        while self._uncommitted:
            await asyncio.sleep(max(0.0, self._committed_at + COMMIT_INTERVAL_S - time.monotonic()))
            await self._commit_relayed()

    async def _commit_relayed(self) -> None:
        offsets = dict(self._uncommitted)
        self._committed_at = time.monotonic()
        self.counts["commits"] += 1
        try:
            await self._reports.commit(offsets)
        except Exception as exc:   # revoked meanwhile: their new owner reads them again
            log.warning("%s: could not commit the reports relayed (%r)", self.name, exc)
        for tp, offset in offsets.items():   # those relayed meanwhile wait for the next commit
            if self._uncommitted.get(tp) == offset:
                del self._uncommitted[tp]

    async def _relay(self, node: str, record) -> asyncio.Future | None:
        """Append one report (the future of its acknowledgement), or dead-letter it."""
        if (KIND_HEADER, USAGE_KIND) in (record.headers or ()):
            return await self._relay_usage(node, record)
        verdict = triage(node, record.value, self.follower.states, self.partitions)
        if verdict.reason and not self._batch_covered:   # maybe the fold lags what the agent saw
            await self._fold_caught_up()
            self._batch_covered = True
            verdict = triage(node, record.value, self.follower.states, self.partitions)
        if verdict.seen:
            self.counts["seen"] += 1   # relayed before a restart: already in the log
            return None
        if verdict.reason:
            return await self._refuse(record, f"report of node {node!r} {verdict.reason}")
        self.counts["relayed"] += 1
        # the agent's trace context, in the envelope and the headers, travels on
        return await self.publisher.send(verdict.event, verdict.pool, verdict.trace_context)

    async def _relay_hosted(self, host: str, record) -> asyncio.Future | None:
        """A record of a node host's topic: checked as its node's own, once the host is
        found to host that node (its name is ``<host>-...``)."""
        node, reason = hosted_node(host, record.headers)
        if reason:
            return await self._refuse(record, f"report of node host {host!r} {reason}")
        return await self._relay(node, record)

    async def _relay_usage(self, node: str, record) -> asyncio.Future | None:
        reason = usage_refusal(node, record.value)
        if reason:
            return await self._refuse(record, f"usage record on the report topic of node {node!r} {reason}")
        self.counts["usage"] += 1
        return await self.publisher.send_raw_later(self.topics.usage, record.value, key=node.encode())

    async def _refuse(self, record, reason: str) -> None:
        self.counts["refused"] += 1
        log.warning("%s: %s", self.name, reason)
        await self.dead_letters.put(record, reason)
        return None

    async def _rewind(self) -> None:
        reader = self._reports
        if self._committing is not None:
            await asyncio.gather(self._committing, return_exceptions=True)
        for tp in reader.assignment():
            committed = await reader.committed(tp)
            if committed is None:
                await reader.seek_to_beginning(tp)
            else:
                reader.seek(tp, committed)


class Verdict(NamedTuple):
    """What to do with one report: append ``event`` to ``pool``'s log, or skip it (``seen``:
    the log has it), or dead-letter it (``reason``)."""

    event: ev.Event | None = None
    pool: str = ""
    reason: str = ""
    seen: bool = False
    trace_context: dict[str, str] | None = None   # the report's envelope's


def triage(node: str, value: bytes | None, states: dict[int, ClusterState], partitions: int) -> Verdict:
    """The relay's decision on a record of ``node``'s report topic, given the folded state
    of each pool-log partition. Pure."""
    try:
        event, envelope = codec.decode(value or b"")
    except codec.DecodeError as exc:
        return Verdict(reason=f"does not decode: {exc}")
    except codec.NewerLogSchema as exc:   # a node-agent upgraded before its relay: its report waits in letters
        return Verdict(reason=f"refused: {exc}")
    pool = envelope.pool
    state = states.get(partition_for(pool, partitions))
    if state is None:
        return Verdict(reason=f"names pool {pool!r}, whose log this relay does not follow")
    if state.dedupe.seen(event.event_id):
        return Verdict(event, pool, seen=True)
    reason = check_report(node, pool, event, state)
    return Verdict(event, pool, reason=f"refused: {reason}" if reason else "",
                   trace_context=dict(envelope.trace_context) or None)


def usage_refusal(node: str, value: bytes | None) -> str:
    """Why a usage record read from ``node``'s report topic may not reach the usage
    topic; '' when it may. Pure."""
    try:
        usage = decode_usage(value or b"")
    except UsageRecordError as exc:
        return f"does not decode: {exc}"
    reason = check_usage_node(node, usage.node)
    return f"refused: {reason}" if reason else ""
