"""The audit and billing database: SQLite by default, PostgreSQL in production.

One SQL layer for both: SQLAlchemy core. Rows come from ``gpusched.consumers.records``,
each keyed by the id of the record it comes from; ``write`` inserts them with "on
conflict do nothing" (both dialects have it), so writing an event's rows again changes
nothing. ``write`` also records, in the same transaction, how far the consumer got in
each partition (``progress``): what ``gpusched billing``/``audit`` report as "up to".

Every table has a ``cluster`` column (the topic prefix), so one database can serve
several deployments and a report for a prefix it never saw says so.
"""
from __future__ import annotations

import math
import os
from dataclasses import asdict
from typing import Iterable

from sqlalchemy import (Boolean, Column, Float, Integer, MetaData, String, Table, Text, create_engine, event,
                        func, inspect, select)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError

from gpusched.config import AccountingSettings
from gpusched.consumers.records import AuditRow, Row, Span, SpanEnd, SpanStart, UsageRow

DEFAULT_URL = AccountingSettings.model_fields["db"].default   # GPUSCHED_ACCOUNTING_DB's default

metadata = MetaData()
audit = Table(
    "audit", metadata,
    Column("event_id", String(64), primary_key=True),
    Column("cluster", String(255), nullable=False, index=True),
    Column("time", Float, nullable=False, index=True),
    Column("pool", String(255), nullable=False),
    Column("action", String(64), nullable=False),
    Column("principal", String(255), nullable=False),
    Column("producer", String(255), nullable=False),
    Column("subject", String(255), nullable=False),
    Column("team", String(255), nullable=False),
    Column("accepted", Boolean, nullable=False),
    Column("detail", Text, nullable=False),
)
span_start = Table(
    "allocation_start", metadata,
    Column("span_id", String(200), primary_key=True),
    Column("cluster", String(255), nullable=False, index=True),
    Column("event_id", String(64), nullable=False),
    Column("job_id", String(128), nullable=False, index=True),
    Column("attempt", Integer, nullable=False),
    Column("team", String(255), nullable=False),
    Column("pool", String(255), nullable=False),
    Column("milli", Integer, nullable=False),
    Column("start", Float, nullable=False),
)
span_end = Table(
    "allocation_end", metadata,
    Column("span_id", String(200), primary_key=True),
    Column("cluster", String(255), nullable=False),
    Column("event_id", String(64), nullable=False),
    Column("end", Float, nullable=False),
)
gpu_usage = Table(
    "gpu_usage", metadata,
    Column("record_id", String(128), primary_key=True),
    Column("cluster", String(255), nullable=False, index=True),
    Column("job_id", String(128), nullable=False, index=True),
    Column("attempt", Integer, nullable=False),
    Column("worker", Integer, nullable=False),
    Column("pool", String(255), nullable=False),
    Column("node", String(255), nullable=False),
    Column("time", Float, nullable=False),
    Column("window_s", Float, nullable=False),
    Column("used_milli_s", Float, nullable=False),
    Column("measured_milli_s", Float, nullable=False),
)
progress = Table(
    "consumer_progress", metadata,
    Column("consumer", String(64), primary_key=True),
    Column("topic", String(255), primary_key=True),
    Column("partition", Integer, primary_key=True),
    Column("cluster", String(255), nullable=False),
    Column("offset", Integer, nullable=False),      # the last record written
    Column("delivered", Integer, nullable=False),   # records handled, redeliveries included
)
TABLE_OF = {AuditRow: audit, SpanStart: span_start, SpanEnd: span_end, UsageRow: gpu_usage}


class StoreError(RuntimeError):
    """The database cannot be reached or used; the message is one line for the user."""


def _one_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


class Store:
    def __init__(self, url: str = DEFAULT_URL, create: bool = True) -> None:
        self.url = url
        try:
            self.engine: Engine = _engine(url, create)
            if create:
                metadata.create_all(self.engine)
            elif not inspect(self.engine).has_table(progress.name):
                raise StoreError(f"database {self.safe_url} holds no gpusched accounting tables "
                                 "(no consumer wrote to it yet)")
        except (ArgumentError, SQLAlchemyError, ImportError) as exc:
            raise StoreError(f"database {self.safe_url}: {_one_line(exc)}") from None
        self._insert = postgresql.insert if self.engine.dialect.name == "postgresql" else sqlite.insert

    @property
    def safe_url(self) -> str:
        """The URL without its password, for messages."""
        try:
            return make_url(self.url).render_as_string(hide_password=True)
        except ArgumentError:
            return repr(self.url)

    def close(self) -> None:
        self.engine.dispose()

    def write(self, cluster: str, rows: Iterable[Row], consumer: str, topic: str, partition: int,
              offset: int) -> None:
        """Rows of one record, and the consumer's progress past it, in one transaction."""
        ins = self._insert
        try:
            with self.engine.begin() as conn:
                for row in rows:
                    table = TABLE_OF[type(row)]
                    conn.execute(ins(table).values(cluster=cluster, **asdict(row)).on_conflict_do_nothing())
                stmt = ins(progress).values(consumer=consumer, topic=topic, partition=partition, cluster=cluster,
                                            offset=offset, delivered=1)
                conn.execute(stmt.on_conflict_do_update(
                    index_elements=[progress.c.consumer, progress.c.topic, progress.c.partition],
                    set_={"offset": stmt.excluded.offset, "delivered": progress.c.delivered + 1}))
        except SQLAlchemyError as exc:
            raise StoreError(f"database {self.safe_url}: {_one_line(exc)}") from None

    # --- queries ---------------------------------------------------------------------
    def _rows(self, query) -> list:
        try:
            with self.engine.connect() as conn:
                return list(conn.execute(query))
        except SQLAlchemyError as exc:
            raise StoreError(f"database {self.safe_url}: {_one_line(exc)}") from None

    def clusters(self) -> list[str]:
        """Prefixes some consumer stored progress for."""
        return [r[0] for r in self._rows(select(progress.c.cluster).distinct().order_by(progress.c.cluster))]

    def progress(self, cluster: str, consumer: str) -> dict[tuple[str, int], tuple[int, int]]:
        """(topic, partition) -> (last offset written, records handled)."""
        q = select(progress.c.topic, progress.c.partition, progress.c.offset, progress.c.delivered).where(
            progress.c.cluster == cluster, progress.c.consumer == consumer)
        return {(t, p): (o, d) for t, p, o, d in self._rows(q)}

    def spans(self, cluster: str, team: str = "", pool: str = "", since: float = -math.inf,
              until: float = math.inf) -> list[Span]:
        """Allocation spans (start joined with its end) overlapping [since, until)."""
        s, e = span_start, span_end
        q = (select(s.c.job_id, s.c.team, s.c.pool, s.c.milli, s.c.start, e.c.end)
             .select_from(s.outerjoin(e, s.c.span_id == e.c.span_id)).where(s.c.cluster == cluster))
        if team:
            q = q.where(s.c.team == team)
        if pool:
            q = q.where(s.c.pool == pool)
        if until < math.inf:
            q = q.where(s.c.start < until)
        if since > -math.inf:
            q = q.where((e.c.end.is_(None)) | (e.c.end > since))
        return [Span(*r) for r in self._rows(q)]

    def used(self, cluster: str, pool: str = "", since: float = -math.inf,
             until: float = math.inf) -> list[tuple[str, str, float, float, float]]:
        """(job id, pool, time, used, measured milli-seconds) of the usage records in range."""
        u = gpu_usage
        q = select(u.c.job_id, u.c.pool, u.c.time, u.c.used_milli_s, u.c.measured_milli_s).where(u.c.cluster == cluster)
        if pool:
            q = q.where(u.c.pool == pool)
        if since > -math.inf:
            q = q.where(u.c.time >= since)
        if until < math.inf:
            q = q.where(u.c.time < until)
        return [tuple(r) for r in self._rows(q)]

    def audit(self, cluster: str, team: str = "", pool: str = "", principal: str = "", action: str = "",
              since: float = -math.inf, until: float = math.inf, limit: int = 0) -> list:
        a = audit
        q = select(a).where(a.c.cluster == cluster).order_by(a.c.time, a.c.event_id)
        for column, value in ((a.c.team, team), (a.c.pool, pool), (a.c.principal, principal), (a.c.action, action)):
            if value:
                q = q.where(column == value)
        if since > -math.inf:
            q = q.where(a.c.time >= since)
        if until < math.inf:
            q = q.where(a.c.time < until)
        if limit:
            q = q.limit(limit)
        return self._rows(q)

    def count(self, table: Table, cluster: str) -> int:
        return self._rows(select(func.count()).select_from(table).where(table.c.cluster == cluster))[0][0]


def _engine(url: str, create: bool) -> Engine:
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://"):]   # the driver the project installs
    if url.startswith("sqlite"):
        path = make_url(url).database or ""
        if not create and path not in ("", ":memory:") and not os.path.exists(path):
            raise StoreError(f"database file {path} does not exist")
        # a busy timeout: the two consumers and the report commands share one file
        engine = create_engine(url, connect_args={"timeout": 30})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return create_engine(url, pool_pre_ping=True, connect_args={"connect_timeout": 10})


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    # WAL: readers (the report commands) never block the consumers' writes
    cursor = dbapi_conn.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()
