"""Writes the per-node work views (``gpusched.adapters.nodes.work_view``) from a follower of the
pool log: the relay's, which already folds every pool and is the nodes' trusted channel.

``on_event`` is the follower's hook. While the follower replays (before ``start``) the
builder only notes what each event touched (``ViewBuilder.note``: no record is built, so
the replay costs the fold little more than the fold itself); ``start`` builds the records
once from the folded state and writes them, in source-offset order, then every new record
as the log is folded, in log order. A restart of the writer thus rewrites every view key
the retained log touched (the same content at the same or a newer source offset: readers
skip or re-apply it, and the agent starts nothing twice) and ends, with a tombstone, every
record of work that ended while it was down.

Records go out in batches, several in flight (``gpusched.adapters.nodes.ordered_sender``): on a
failure every batch in flight is sent again, in order, so the newest record of each key
still lands last (readers skip what they already applied). A batch is encoded once: a
batch sent again carries the same records, those that had waited for their node's topic
included.

Whether a node's work topic exists is read from the broker's metadata, fetched after the
node's registration was folded (its agent makes the topic before it registers): one fetch
answers for every registration folded before it began, so thousands of nodes joining at
once (a node host's) cost a few metadata requests, not one each.

A node whose work topic does not exist (a node registered without an agent, as the
simulator's) gets nothing written: its records wait, the latest per key, until the node
registers again and its topic is found; a tombstone only drops its key's waiting record
(no reader can have read the key), so what waits is the node's live work. A node served
by a node host (``gpusched node-host``: named ``<host>-...``, where the host's report
topic exists, as the metadata that shows the node without a work topic tells) never has
a work topic, since its host reads the pool log: no record is built for it at all
(``ViewBuilder.skip_node``).
"""
from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import NamedTuple

from gpusched.adapters.telemetry import tracing
from gpusched.adapters.broker.kafka_admin import TopicNames
from gpusched.adapters.broker.kafka_security import Where
from gpusched.adapters.nodes.ordered_sender import OrderedSender
from gpusched.adapters.log.publisher import EventPublisher
from gpusched.adapters.nodes.reports import HOST_REPORTS, hosted_by
from gpusched.adapters.broker.topic_reader import TopicReader
from gpusched.adapters.nodes.work_view import NODE_KEY, ViewBuilder, ViewRecord, work_topic
from gpusched.core.state import ClusterState

log = logging.getLogger("gpusched.work_view")
BATCH = 500


class Message(NamedTuple):
    """One record as it goes to a node's work topic (encoded once, sent again as is)."""
    topic: str
    key: bytes
    value: bytes | None
    headers: list[tuple[str, bytes]]


class WorkViewWriter:
    def __init__(self, bootstrap: Where, topics: TopicNames, publisher: EventPublisher, name: str) -> None:
        self.topics = topics
        self.publisher = publisher
        self.name = name
        self.builder = ViewBuilder(tracing.JOBS.carrier, tracing.consumed_carrier)
        self.counts = {"written": 0, "parked": 0, "metadata": 0}
        self._bootstrap = bootstrap
        self._live = False
        self._parked: dict[str, dict[str, ViewRecord]] = {}     # node without a topic -> key -> record
        self._topics: dict[str, bool] = {}                      # node -> whether its topic exists
        self._registered_at: dict[str, float] = {}              # node -> when its registration was folded
        self._metadata_topics: set[str] = set()                 # the topics of the last metadata fetched
        self._metadata_at = -math.inf                           # when that fetch began
        self._started_at = math.inf
        self._hosts: set[str] = set()                           # node hosts whose report topic exists
        self._queue: asyncio.Queue[ViewRecord] = asyncio.Queue()
        self._sender: OrderedSender[Message] = OrderedSender(self._publish, self._acked, name)
        self._meta: TopicReader | None = None   # asks the broker for every topic's name
        self._task: asyncio.Task | None = None

    def on_event(self, partition: int, offset: int, event, outcome, state) -> None:
        if not self._live:
            self.builder.note(partition, offset, event, outcome, state)
            return
        for record in self.builder.records(partition, offset, event, outcome, state):
            if record.key == NODE_KEY and not record.value.get("lost"):
                self._registered_at[record.node] = time.monotonic()
            self._queue.put_nowait(record)

    async def start(self, states: dict[int, ClusterState]) -> None:
        """Go live: write the views of ``states`` (the follower's, folded so far), then
        every change."""
        self._meta = TopicReader(self._bootstrap, client_id=f"{self.name}-work-views")
        await self._meta.start()
        self._started_at = time.monotonic()   # the nodes registered so far: any fetch from now on
        nodes = [node for state in states.values() for node in state.nodes]
        if nodes:   # the replay registered nodes: one look tells the node hosts' apart
            await self._fetch_metadata()
            for node in nodes:
                if work_topic(self.topics.prefix, node) not in self._metadata_topics and self._hosted(node):
                    self.builder.skip_node(node)
        # No await from here on: no event is folded between the resync and going live.
        for record in self.builder.resync(states):
            self._queue.put_nowait(record)
        self._live = True
        self._task = asyncio.create_task(self._run(), name=f"work-views-{self.name}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._meta is not None:
            await self._meta.stop()

    async def idle(self) -> None:
        """Wait until every record queued so far is acknowledged (tests, benches)."""
        await self._queue.join()

    async def _run(self) -> None:
        acks = asyncio.create_task(self._sender.run(), name=f"work-view-acks-{self.name}")
        try:
            while True:
                batch = [await self._queue.get()]
                while len(batch) < BATCH and not self._queue.empty():
                    batch.append(self._queue.get_nowait())
                out = [message for record in batch for message in await self._route_retrying(record)]
                await self._sender.put(out, len(batch))
        finally:
            acks.cancel()
            await asyncio.gather(acks, return_exceptions=True)

    def _acked(self, records: int) -> None:
        for _ in range(records):
            self._queue.task_done()

    async def _route_retrying(self, record: ViewRecord) -> list[Message]:
        """``_route``, again until the metadata it may need could be fetched."""
        delay = 0.2
        while True:
            try:
                return await self._route(record)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("%s: looking up the work topic of %s failed (%r); again in %.1fs",
                            self.name, record.node, exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def _route(self, record: ViewRecord) -> list[Message]:
        """The messages that carry ``record``: none for a node served by a node host or
        whose topic does not exist yet (the record waits, parked), else the records that
        waited for its node (in log order, but one of the same key) and it."""
        node = record.node
        registered = record.key == NODE_KEY and not record.value.get("lost")
        has_topic = await self._has_topic(node, registered)
        # A host makes its topics before its nodes register: the metadata that says the
        # node has no work topic names the host's report topic.
        if registered and not has_topic and self._hosted(node):
            self.builder.skip_node(node)
            self._parked.pop(node, None)
        if node in self.builder.skip:   # records built before its registration was sent
            return []
        if not has_topic:
            parked = self._parked.setdefault(node, {})
            if record.gone:   # no reader has read the key (no topic): nothing to end
                parked.pop(record.key, None)
            else:
                parked[record.key] = record
                self.counts["parked"] += 1
            return []
        parked = self._parked.pop(node, {})
        earlier = sorted((r for r in parked.values() if r.key != record.key), key=lambda r: r.value["offset"])
        return [self._message(r) for r in (*earlier, record)]

    def _message(self, record: ViewRecord) -> Message:
        key, value, headers = record.encode()
        self.counts["written"] += 1
        return Message(work_topic(self.topics.prefix, record.node), key, value, headers)

    async def _publish(self, message: Message) -> asyncio.Future:
        return await self.publisher.send_raw_later(message.topic, message.value, key=message.key,
                                                   headers=message.headers)

    async def _has_topic(self, node: str, registered: bool = False) -> bool:
        """Whether ``node``'s work topic exists. A registration asks again (its agent may
        have made the topic since), answered by metadata fetched after the registration
        was folded; a node whose registration this writer did not fold, by metadata
        fetched after the writer started."""
        since = self._registered_at.get(node, self._started_at) if registered else self._started_at
        known = None if registered else self._topics.get(node)
        if known is None:
            topic = work_topic(self.topics.prefix, node)
            if topic not in self._metadata_topics and self._metadata_at <= since:
                await self._fetch_metadata()
            known = self._topics[node] = topic in self._metadata_topics
        if registered:   # answered (a failed fetch leaves it, for the next try)
            self._registered_at.pop(node, None)
        return known

    async def _fetch_metadata(self) -> None:
        """Every topic's name, from a metadata request sent now (not one in flight), noting
        the node hosts' among them."""
        self._metadata_at = time.monotonic()
        self.counts["metadata"] += 1
        self._metadata_topics = await self._meta.topics()
        head = self.topics.prefix + HOST_REPORTS
        self._hosts = {t[len(head):] for t in self._metadata_topics if t.startswith(head)}

    def _hosted(self, node: str) -> bool:
        """Whether a node host we know of serves ``node`` (it may speak for ``<host>-...``)."""
        return any(hosted_by(node[:i], node) for i, c in enumerate(node) if c == "-" and node[:i] in self._hosts)
