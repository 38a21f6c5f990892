"""Kafka topic layout and admin helpers (aiokafka).

The scheduler uses five topics, all named from one prefix so that tests (and
several deployments on one cluster) can keep theirs apart:

* ``<prefix>cluster-events``  the event log (source of truth), keyed by pool;
                              kept forever.
* ``<prefix>heartbeats``      node-agent liveness; 4 partitions, ~1 hour retention.
* ``<prefix>dead-letters``    events that could not be applied; 1 partition.
* ``<prefix>snapshots``       state snapshots, compacted, one partition per
                              events partition.
* ``<prefix>usage``           measured GPU usage per worker (``WorkerUsage``), keyed by
                              node; 4 partitions, 30 days retention.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError, for_code

DEFAULT_PREFIX = "gpusched."

# Errors that mean "broker not ready yet" rather than "bad request": on a
# freshly started single-node cluster CreateTopics can answer
# INVALID_REPLICATION_FACTOR until the broker has registered with the controller.
_TRANSIENT_CODES = {7, 38, 41}  # REQUEST_TIMED_OUT, INVALID_REPLICATION_FACTOR, NOT_CONTROLLER


@dataclass(frozen=True)
class TopicNames:
    """Topic names derived from a prefix, e.g. ``TopicNames("t-foo-ab12cd.")``."""

    prefix: str = DEFAULT_PREFIX
    events: str = field(init=False)
    heartbeats: str = field(init=False)
    dead_letters: str = field(init=False)
    snapshots: str = field(init=False)
    usage: str = field(init=False)

    def __post_init__(self) -> None:
        # frozen dataclass: derived fields are set through object.__setattr__
        object.__setattr__(self, "events", self.prefix + "cluster-events")
        object.__setattr__(self, "heartbeats", self.prefix + "heartbeats")
        object.__setattr__(self, "dead_letters", self.prefix + "dead-letters")
        object.__setattr__(self, "snapshots", self.prefix + "snapshots")
        object.__setattr__(self, "usage", self.prefix + "usage")

    def all(self) -> tuple[str, ...]:
        return (self.events, self.heartbeats, self.dead_letters, self.snapshots, self.usage)


def topic_specs(
    names: TopicNames, event_partitions: int = 4, replication_factor: int = 1
) -> list[NewTopic]:
    """The NewTopic definitions for ``names`` (partition counts and configs)."""
    rf = replication_factor
    return [
        # The event log is the source of truth: never delete by time or size.
        NewTopic(names.events, event_partitions, rf,
                 topic_configs={"retention.ms": "-1", "retention.bytes": "-1"}),
        NewTopic(names.heartbeats, 4, rf,
                 topic_configs={"retention.ms": str(60 * 60 * 1000)}),
        NewTopic(names.dead_letters, 1, rf,
                 topic_configs={"retention.ms": str(7 * 24 * 60 * 60 * 1000)}),
        # Latest snapshot per key survives compaction; partitioned like events so a
        # snapshot lives in the partition number of the events it summarises.
        NewTopic(names.snapshots, event_partitions, rf,
                 topic_configs={"cleanup.policy": "compact", "max.message.bytes": str(64 * 1024 * 1024)}),
        # Measurements: kept long enough to fold a month of allocated vs used; a consumer
        # that reports over longer spans keeps its own totals.
        NewTopic(names.usage, 4, rf, topic_configs={"retention.ms": str(30 * 24 * 60 * 60 * 1000)}),
    ]


async def wait_for_broker(bootstrap: str, timeout_s: float = 60.0) -> None:
    """Return once the cluster answers a metadata request listing a broker.

    Raises TimeoutError (chained to the last connection error) after timeout_s.
    """
    deadline = time.monotonic() + timeout_s
    last_exc: BaseException | None = None
    while time.monotonic() < deadline:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5000)
        try:
            await admin.start()
            # KRaft leaves fenced brokers out of metadata: non-empty == usable.
            if (await admin.describe_cluster()).get("brokers"):
                return
        except Exception as exc:  # connection refused, timeouts, ...
            last_exc = exc
        finally:
            await admin.close()
        await asyncio.sleep(0.5)
    raise TimeoutError(f"Kafka at {bootstrap} did not answer within {timeout_s}s") from last_exc


async def delete_topics(bootstrap: str, names: TopicNames, timeout_s: float = 30.0) -> str:
    """Delete a prefix's topics (benchmarks and tests, so a long-lived broker does not pile
    up partitions); best effort: '' when done, else why not."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=int(timeout_s * 1000))
    try:
        await asyncio.wait_for(admin.start(), timeout_s)
        await admin.delete_topics(list(names.all()))
        return ""
    except Exception as exc:
        return repr(exc)
    finally:
        await admin.close()


async def ensure_topics(
    bootstrap: str,
    names: TopicNames,
    event_partitions: int = 4,
    *,
    replication_factor: int = 1,
    timeout_s: float = 60.0,
) -> None:
    """Create the topics in ``names`` that are missing and wait until the
    metadata shows all of them with a leader for every partition.

    Existing topics are left as they are (their partition counts/configs are
    not checked or altered).
    """
    specs = {t.name: t for t in topic_specs(names, event_partitions, replication_factor)}
    deadline = time.monotonic() + timeout_s
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=15000)
    try:
        await admin.start()

        # 1. Create what is missing, retrying transient errors until the deadline.
        missing = set(specs) - set(await admin.list_topics())
        while missing:
            resp = await admin.create_topics([specs[n] for n in sorted(missing)],
                                             timeout_ms=15000)
            # CreateTopics answers per topic: (name, error_code, [error_message])
            for name, code, *rest in resp.topic_errors:
                err = for_code(code) if code else None
                if code == 0 or err is TopicAlreadyExistsError:
                    missing.discard(name)
                elif code not in _TRANSIENT_CODES or time.monotonic() > deadline:
                    raise err(f"creating topic {name!r}: {rest[0] if rest else ''}")
            if missing:
                await asyncio.sleep(0.5)

        # 2. Creation is asynchronous: wait until every partition has a leader.
        while True:
            described = {t["topic"]: t for t in await admin.describe_topics(list(specs))}
            if all(_ready(described.get(n)) for n in specs):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"topics {sorted(specs)} not ready after {timeout_s}s")
            await asyncio.sleep(0.2)
    finally:
        await admin.close()


def _ready(topic: dict | None) -> bool:
    # KRaft creates all partitions of a topic in one metadata batch, so "known,
    # no error, every listed partition has a leader" means ready.
    if topic is None or topic["error_code"] != 0:
        return False
    parts = topic["partitions"]
    return bool(parts) and all(p["leader"] >= 0 for p in parts)
