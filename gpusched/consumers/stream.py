"""The audit and billing consumers: faust-streaming apps writing to the database.

``gpusched audit-consumer`` and ``gpusched billing-consumer`` each run one faust app
(id and consumer group ``<prefix>audit`` / ``<prefix>billing``) whose agent reads the
pool log (billing also ``<prefix>usage``). Faust commits a record's offset only after
the agent handled it, and the agent writes the record's rows before it moves on, so a
consumer killed at any instant loses nothing: the records after the committed offset
come again, and their rows, keyed by record id, are written again as no-ops.

What an event means depends on the state it lands in (a placement is a proposal the
reducer may refuse), so each partition's state is folded here with the shared reducer.
A consumer that starts a partition mid-log (the group's committed offset) first folds
the records before it from Kafka with a plain reader, writing nothing: their rows were
stored by the run that committed them. See docs/guide/audit-billing.md.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import tempfile
from typing import Callable

from aiokafka import TopicPartition

from gpusched.adapters.log import codec
from gpusched.adapters.broker.kafka_security import KafkaConnection, _ssl_context
from gpusched.adapters.broker.topic_reader import TopicReader
from gpusched.adapters.broker.kafka_admin import TopicNames
from gpusched.adapters.nodes.usage_records import UsageRecordError, decode_usage
from gpusched.consumers.records import Row, SpanTracker, audit_row, usage_row
from gpusched.consumers.store import Store, StoreError
from gpusched.core import events as ev
from gpusched.core.reducer import Outcome, apply
from gpusched.core.state import ClusterState

log = logging.getLogger(__name__)
KINDS = ("audit", "billing")

# (event, outcome, state after it, pool) -> rows of the event
RowsOf = Callable[[ev.Event, Outcome, ClusterState, str], list[Row]]


def rows_of_kind(kind: str) -> RowsOf:
    """A fresh rows function of ``kind`` for one partition (billing's tracks its charges)."""
    if kind == "audit":
        def audit_rows(event, outcome, state, pool):
            row = audit_row(event, outcome, state, pool)
            return [row] if row is not None else []
        return audit_rows
    tracker = SpanTracker()
    return lambda event, outcome, state, pool: tracker.observe(event, outcome, state)


class PartitionFold:
    """Each partition's ``ClusterState``, folded in log order; ``rows`` of each new record."""

    def __init__(self, conn: KafkaConnection, topic: str, kind: str) -> None:
        self.states: dict[int, ClusterState] = {}
        self._rows_of: dict[int, RowsOf] = {}
        self._conn = conn
        self._topic = topic
        self._kind = kind

    async def rows(self, partition: int, offset: int, value: bytes) -> list[Row] | None:
        """The rows of the record at ``offset``; None when this process folded it already
        (a redelivery after a rebalance: its rows were written then)."""
        state = self.states.get(partition)
        if state is None:
            state = self.states[partition] = ClusterState()
            self._rows_of[partition] = rows_of_kind(self._kind)
        if offset <= state.offset:
            return None
        if offset > state.offset + 1:   # started mid-log: fold what came before first
            await self._fold_gap(partition, state, offset)
        return self._fold(state, offset, value, partition)

    def _fold(self, state: ClusterState, offset: int, value: bytes, partition: int) -> list[Row]:
        state.offset = offset
        try:
            event, envelope = codec.decode(value)
        except codec.DecodeError as exc:
            # the services that write the log dead-letter it; a reader only notes it
            log.warning("%s[%d]@%d does not decode: %s", self._topic, partition, offset, exc)
            return []
        try:
            outcome = apply(state, event)
        except Exception:   # a reducer bug must not stop the consumer (the services dead-letter it)
            log.exception("reducer failed on %s[%d]@%d", self._topic, partition, offset)
            return []
        return self._rows_of[partition](event, outcome, state, envelope.pool)

    async def _fold_gap(self, partition: int, state: ClusterState, offset: int) -> None:
        """Fold records state.offset+1 .. offset-1 from Kafka, keeping none of their rows."""
        tp = TopicPartition(self._topic, partition)
        reader = TopicReader(self._conn, auto_offset_reset="earliest", max_partition_fetch_bytes=16 * 1024 * 1024)
        await reader.start()
        folded, reached = 0, False
        try:
            await reader.assign([tp], state.offset + 1)
            while not reached:
                batches = await reader.fetch(tp, timeout_ms=1000, max_records=10_000)
                for record in batches.get(tp, []):
                    # ``offset`` itself is being delivered, so the loop always ends, also
                    # where records before it are gone (a log that lost its beginning)
                    reached = record.offset >= offset - 1
                    if record.offset >= offset:
                        break
                    self._fold(state, record.offset, record.value or b"", partition)
                    folded += 1
                    if reached:
                        break
        finally:
            await reader.stop()
        log.info("%s[%d]: folded %d records before offset %d (stored by an earlier run)",
                 self._topic, partition, folded, offset)


def build_app(kind: str, conn: KafkaConnection, prefix: str, store: Store, data_dir: str = ""):
    """The faust app of ``kind`` (audit or billing), reading as ``conn``'s principal."""
    import faust

    from gpusched.adapters.broker.kafka_admin import TopicNames

    topics = TopicNames(prefix)
    credentials = None
    if conn.secured:
        credentials = faust.SASLCredentials(username=conn.username, password=conn.password,
                                            ssl_context=_ssl_context(conn.ca_file), mechanism=conn.sasl_mechanism)
    # faust keeps only small files there (no tables: the state is folded from the log)
    data_dir = data_dir or os.path.join(tempfile.gettempdir(), "gpusched-faust", prefix + kind)
    os.makedirs(data_dir, exist_ok=True)
    app = faust.App(
        prefix + kind,   # also the consumer group: the Kafka ACLs grant <prefix>audit / <prefix>billing
        broker=[f"kafka://{address.strip()}" for address in conn.bootstrap.split(",")],
        broker_credentials=credentials,
        store="memory://",
        # no leader-election topic, no web server: the principal may create no topic, and
        # several consumers share a host
        topic_disable_leader=True, web_enabled=False,
        consumer_auto_offset_reset="earliest",
        broker_commit_every=100, broker_commit_interval=1.0,
        datadir=data_dir,
        autodiscover=False,
    )
    fold = PartitionFold(conn, topics.events, kind)

    events = app.topic(topics.events, value_type=bytes, key_type=bytes, value_serializer="raw",
                       key_serializer="raw")

    def write(rows: list[Row], topic: str, partition: int, offset: int) -> None:
        try:
            store.write(prefix, rows, kind, topic, partition, offset)
        except StoreError as exc:
            # stop without acknowledging: the record comes again after a restart
            print(f"gpusched {kind}-consumer: {exc}", file=sys.stderr, flush=True)
            os._exit(1)

    @app.agent(events, name=f"{kind}-events")
    async def fold_events(stream):
        async for record in stream.events():
            message = record.message
            rows = await fold.rows(message.partition, message.offset, record.value or b"")
            if rows is not None:
                write(rows, message.topic, message.partition, message.offset)

    if kind == "billing":
        usage = app.topic(topics.usage, value_type=bytes, key_type=bytes, value_serializer="raw",
                          key_serializer="raw")

        @app.agent(usage, name="billing-usage")
        async def fold_usage(stream):
            async for record in stream.events():
                message = record.message
                try:
                    rows: list[Row] = [usage_row(decode_usage(record.value or b""))]
                except UsageRecordError as exc:
                    log.warning("%s[%d]@%d: %s", message.topic, message.partition, message.offset, exc)
                    rows = []
                write(rows, message.topic, message.partition, message.offset)

    @app.task
    async def announce():
        print(f"gpusched {kind}-consumer ready: group {app.conf.id}, database {store.safe_url}", flush=True)

    return app


def main(argv: list[str] | None, kind: str) -> int:
    """``gpusched audit-consumer`` / ``billing-consumer``: run the consumer until stopped."""
    from gpusched.config import AccountingSettings, ConsumerSettings, KafkaSettings, kafka_settings

    parser = argparse.ArgumentParser(prog=f"gpusched {kind}-consumer",
                                     description=f"Store the {kind} records of the pool log in a database "
                                                 "(docs/guide/audit-billing.md).")
    for model in (KafkaSettings, AccountingSettings, ConsumerSettings):
        model.add_args(parser)
    args = parser.parse_args(argv)
    try:
        settings = kafka_settings(args)
        db, own = AccountingSettings.from_args(args).db, ConsumerSettings.from_args(args)
        store = Store(db)
    except (ValueError, StoreError) as exc:
        print(f"gpusched {kind}-consumer: {exc}", file=sys.stderr)
        return 1
    problem = asyncio.run(_check_broker(settings, own.connect_timeout))
    if problem:
        print(f"gpusched {kind}-consumer: {problem}", file=sys.stderr)
        return 1
    import faust

    app = build_app(kind, KafkaConnection.from_settings(settings), settings.topic_prefix, store)
    worker = faust.Worker(app, loglevel=settings.log_level, quiet=True, redirect_stdouts=False)
    worker.spinner = None   # a terminal spinner's escape codes would clutter a service's log
    worker.execute_from_commandline()   # runs until SIGTERM/SIGINT; exits the process
    return 0


async def _check_broker(settings, timeout_s: float) -> str:
    """Why the consumer cannot start on this broker and prefix ('' when it can), in one line."""
    from gpusched.adapters.broker.kafka_admin import wait_for_broker
    from gpusched.adapters.broker.kafka_security import KafkaLoginRefused
    from gpusched.consumers.usage_report import missing_topics

    conn = KafkaConnection.from_settings(settings)

    client_log = logging.getLogger("aiokafka")
    level = client_log.level
    client_log.setLevel(logging.CRITICAL)   # one clear line, not a connection error a try
    try:
        await wait_for_broker(conn, timeout_s)
    except (TimeoutError, KafkaLoginRefused) as exc:
        return str(exc)
    finally:
        client_log.setLevel(level)
    missing = await missing_topics(conn, TopicNames(settings.topic_prefix))
    if missing:
        return (f"no topic {', '.join(missing)} on {conn} "
                "(wrong --topic-prefix, or no cluster has run there)")
    return ""


def audit_main(argv: list[str] | None = None) -> int:
    return main(argv, "audit")


def billing_main(argv: list[str] | None = None) -> int:
    return main(argv, "billing")
