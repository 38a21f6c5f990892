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
import logging
import time
from dataclasses import dataclass, field

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import TopicAlreadyExistsError, for_code

from gpusched.adapters.broker.kafka_security import Where, check_login, client_args

log = logging.getLogger("gpusched.kafka_admin")

DEFAULT_PREFIX = "gpusched."

# Errors that mean "broker not ready yet" rather than "bad request": on a
# freshly started single-node cluster CreateTopics can answer
# INVALID_REPLICATION_FACTOR until the broker has registered with the controller.
_TRANSIENT_CODES = {7, 38, 41}  # REQUEST_TIMED_OUT, INVALID_REPLICATION_FACTOR, NOT_CONTROLLER
_NOT_ALLOWED = {29, 31}         # TOPIC_AUTHORIZATION_FAILED, CLUSTER_AUTHORIZATION_FAILED


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
    names: TopicNames, event_partitions: int = 4, replication_factor: int = 1, min_insync: int = 1
) -> list[NewTopic]:
    """The NewTopic definitions for ``names`` (partition counts and configs)."""
    rf = replication_factor
    specs = [
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
    # Producers write with acks=all: a write is acknowledged once min.insync copies have it.
    for spec in specs:
        spec.topic_configs["min.insync.replicas"] = str(min_insync)
    return specs


async def wait_for_broker(bootstrap: Where, timeout_s: float = 60.0) -> None:
    """Return once the cluster answers a metadata request listing a broker.

    Raises TimeoutError (chained to the last connection error) after timeout_s, or
    ``KafkaLoginRefused`` at once when the broker refuses the login.
    """
    deadline = time.monotonic() + timeout_s
    last_exc: BaseException | None = None
    while time.monotonic() < deadline:
        admin = AIOKafkaAdminClient(**client_args(bootstrap), request_timeout_ms=5000)
        try:
            await admin.start()
            # KRaft leaves fenced brokers out of metadata: non-empty == usable.
            if (await admin.describe_cluster()).get("brokers"):
                return
        except Exception as exc:  # connection refused, timeouts, ...
            last_exc = exc
        finally:
            await admin.close()
        await check_login(bootstrap)   # a refused login: say so now, not after the timeout
        await asyncio.sleep(0.5)
    raise TimeoutError(f"Kafka at {bootstrap} did not answer within {timeout_s}s") from last_exc


async def delete_topics(bootstrap: Where, names: TopicNames, timeout_s: float = 30.0) -> str:
    """Delete every topic of a prefix (the demo, benchmarks and tests, so a long-lived
    broker does not pile up partitions): its five and each node's and node host's report,
    beats and work-view topics. Best effort: '' when done, else why not."""
    admin = AIOKafkaAdminClient(**client_args(bootstrap), request_timeout_ms=int(timeout_s * 1000))
    try:
        await asyncio.wait_for(admin.start(), timeout_s)
        ours = [t for t in await admin.list_topics() if t.startswith(names.prefix)]
        if ours:
            response = await admin.delete_topics(ours)
            failed = [(topic, code) for topic, code, *_ in response.topic_error_codes if code]
            if failed:
                return f"{len(failed)} of {len(ours)} topics not deleted, e.g. {failed[0][0]} (error {failed[0][1]})"
        return ""
    except Exception as exc:
        return repr(exc)
    finally:
        await admin.close()


def replication_for(brokers: int, replication_factor: int = 0, min_insync: int = 0) -> tuple[int, int]:
    """(replication factor, min.insync.replicas); 0 means "follow the cluster": 3 copies
    with 2 in sync on 3+ brokers (one broker may fail and every acknowledged write is on
    two disks), else one copy."""
    rf = replication_factor or (3 if brokers >= 3 else 1)
    isr = min_insync or max(1, min(rf - 1, 2))
    if rf > max(brokers, 1) or isr > rf:
        raise ValueError(f"replication factor {rf} / min.insync.replicas {isr} impossible on {brokers} broker(s)")
    return rf, isr


async def ensure_topics(
    bootstrap: Where,
    names: TopicNames,
    event_partitions: int = 4,
    *,
    replication_factor: int = 0,
    min_insync_replicas: int = 0,
    timeout_s: float = 60.0,
) -> list[str]:
    """Create the topics in ``names`` that are missing and wait until the
    metadata shows all of them with a leader for every partition.

    Replication follows ``replication_for`` (0: the cluster's size). Existing topics
    with fewer copies or a lower ``min.insync.replicas`` are reported (a warning naming
    topic and setting, also returned); min.insync is raised where this principal may
    alter configs, the replication factor needs a partition reassignment and is only
    reported.
    """
    deadline = time.monotonic() + timeout_s
    admin = AIOKafkaAdminClient(**client_args(bootstrap), request_timeout_ms=15000)
    try:
        await admin.start()
        brokers = len((await admin.describe_cluster()).get("brokers") or ())
        rf, isr = replication_for(brokers, replication_factor, min_insync_replicas)
        specs = {t.name: t for t in topic_specs(names, event_partitions, rf, isr)}
        existing = set(await admin.list_topics())

        # 1. Create what is missing, retrying transient errors until the deadline.
        missing = set(specs) - existing
        while missing:
            resp = await admin.create_topics([specs[n] for n in sorted(missing)],
                                             timeout_ms=15000)
            # CreateTopics answers per topic: (name, error_code, [error_message])
            for name, code, *rest in resp.topic_errors:
                err = for_code(code) if code else None
                if code == 0 or err is TopicAlreadyExistsError:
                    missing.discard(name)
                elif code in _NOT_ALLOWED:
                    raise PermissionError(f"topic {name} does not exist and this Kafka principal may not "
                                          "create it: run `gpusched kafka-setup` as the admin first")
                elif code not in _TRANSIENT_CODES or time.monotonic() > deadline:
                    raise err(f"creating topic {name!r}: {rest[0] if rest else ''}")
            if missing:
                await asyncio.sleep(0.5)

        # 2. Creation is asynchronous: wait until every partition has a leader.
        while True:
            described = {t["topic"]: t for t in await admin.describe_topics(list(specs))}
            if all(_ready(described.get(n)) for n in specs):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"topics {sorted(specs)} not ready after {timeout_s}s")
            await asyncio.sleep(0.2)
        # 3. Topics that were there already: are they as safe as asked?
        return await check_replication(admin, described, sorted(existing & set(specs)), rf, isr)
    finally:
        await admin.close()


def _ready(topic: dict | None) -> bool:
    # KRaft creates all partitions of a topic in one metadata batch, so "known,
    # no error, every listed partition has a leader" means ready.
    if topic is None or topic["error_code"] != 0:
        return False
    parts = topic["partitions"]
    return bool(parts) and all(p["leader"] >= 0 for p in parts)


async def check_replication(admin: AIOKafkaAdminClient, described: dict, topics: list[str],
                            rf: int, isr: int) -> list[str]:
    """Warn about each existing topic with fewer than ``rf`` copies or a
    ``min.insync.replicas`` below ``isr``, and raise the latter where allowed."""
    problems: list[str] = []
    copies: dict[str, int] = {}
    for name in topics:
        copies[name] = min((len(p["replicas"]) for p in described[name]["partitions"]), default=0)
        if copies[name] < rf:
            problems.append(f"topic {name}: replication factor {copies[name]} < {rf} (needs a partition "
                            "reassignment: kafka-reassign-partitions)")
    low = await _low_min_insync(admin, topics, isr)
    safe: list[str] = []
    for name, value in low.items():
        # Raising it never loses data, but above the copies there are it would stop every
        # acks=all write: only raise while one copy may still fail (replicas - 1).
        if min(isr, copies[name] - 1) > value:
            safe.append(name)
            problems.append(f"topic {name}: min.insync.replicas {value} < {isr}")
        else:
            problems.append(f"topic {name}: min.insync.replicas {value} < {isr} (kept: the topic has "
                            f"{copies[name]} cop{'y' if copies[name] == 1 else 'ies'})")
    for name in await _raise_min_insync(admin, safe, isr):
        problems.append(f"topic {name}: min.insync.replicas raised to {isr}")
    for line in problems:
        log.warning("%s", line)
    return problems


async def _low_min_insync(admin: AIOKafkaAdminClient, topics: list[str], isr: int) -> dict[str, int]:
    if not topics:
        return {}
    try:
        responses = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, t, {"min.insync.replicas": None}) for t in topics])
    except Exception as exc:   # a principal without DescribeConfigs: say so, go on
        log.warning("cannot read min.insync.replicas of %s: %r", topics, exc)
        return {}
    low: dict[str, int] = {}
    for response in responses:
        for _code, _msg, _type, name, entries in response.resources:
            for entry in entries:
                if entry[0] == "min.insync.replicas" and int(entry[1]) < isr:
                    low[name] = int(entry[1])
    return low


async def _raise_min_insync(admin: AIOKafkaAdminClient, topics: list[str], isr: int) -> list[str]:
    """Alter ``min.insync.replicas`` online (it only makes acks=all stricter)."""
    if not topics:
        return []
    try:
        responses = await admin.alter_configs(
            [ConfigResource(ConfigResourceType.TOPIC, t, {"min.insync.replicas": str(isr)}) for t in topics])
    except Exception as exc:
        log.warning("cannot raise min.insync.replicas of %s: %r", topics, exc)
        return []
    done = []
    for response in responses:
        for code, _msg, _type, name in response.resources:
            if code == 0:
                done.append(name)
            else:
                log.warning("cannot raise min.insync.replicas of %s: error %s", name, code)
    return done
