"""What one node needs on the broker: its report and beats topics, and on a secured
cluster its own Kafka login (SCRAM user ``node-agent.<node>``) with its ACLs
(docs/reference/kafka-security.md).

``add_node`` runs as the admin (``gpusched kafka-setup --node NAME``, the tests'
``LocalCluster``); ``ensure_node_topics`` is also what an agent calls at start, which on
a plaintext cluster creates its topics and on a secured one only finds them.
"""
from __future__ import annotations

import asyncio
import hashlib
import secrets
import time
from dataclasses import replace
from functools import partial

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError, for_code
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import CompactArray, CompactBytes, CompactString, Int8, Int16, Int32, Schema, TaggedFields

from gpusched.adapters.broker.kafka_acls import grant_host_acls, grant_node_acls
from gpusched.adapters.broker.kafka_admin import TopicNames, replication_for
from gpusched.adapters.broker.kafka_security import (KafkaConnection, KafkaLoginRefused, Where, check_login, client_args,
                                              connection)
from gpusched.adapters.nodes.reports import (beats_topic, host_beats_topic, host_principal, host_report_topic,
                                       node_principal, report_topic)
from gpusched.adapters.nodes.work_view import work_topic

_NOT_ALLOWED = {29, 31}   # TOPIC_AUTHORIZATION_FAILED, CLUSTER_AUTHORIZATION_FAILED
_MECHANISMS = {"SCRAM-SHA-256": (1, "sha256"), "SCRAM-SHA-512": (2, "sha512")}
SCRAM_ITERATIONS = 8192   # Kafka's minimum for SCRAM-SHA-512 is 4096
REPORT_RETENTION_MS = 7 * 24 * 3600 * 1000   # reports are relayed within seconds; a week to look back
BEATS_RETENTION_MS = 3600 * 1000              # as <prefix>heartbeats: only the latest beats matter
# A work view's tombstones (work ended) outlive compaction this long: an agent reading its
# view from the start must get past them within it to see the end (Kafka's default, said here).
WORK_TOMBSTONE_RETENTION_MS = 24 * 3600 * 1000


async def ensure_node_topics(where: Where, names: TopicNames, node: str, *, replication_factor: int = 0,
                             min_insync_replicas: int = 0, timeout_s: float = 60.0) -> str:
    """The node's report topic (one partition: its reports stay in order), beats topic and
    work view (one partition, compacted: the latest record of each key is what the node
    must run; ``gpusched.adapters.nodes.work_view``), created when missing; returns the report
    topic. PermissionError when this principal may not create them (a secured cluster where ``gpusched kafka-setup --node`` was not run)."""
    topics = {report_topic(names.prefix, node): {"retention.ms": str(REPORT_RETENTION_MS)},
              beats_topic(names.prefix, node): {"retention.ms": str(BEATS_RETENTION_MS)},
              work_topic(names.prefix, node): {"cleanup.policy": "compact",
                                               "delete.retention.ms": str(WORK_TOMBSTONE_RETENTION_MS)}}
    await _ensure_topics(where, topics, f"run `gpusched kafka-setup --node {node}` as the admin first",
                         replication_factor, min_insync_replicas, timeout_s)
    return report_topic(names.prefix, node)


async def ensure_host_topics(where: Where, names: TopicNames, host: str, *, replication_factor: int = 0,
                             min_insync_replicas: int = 0, timeout_s: float = 60.0) -> str:
    """A node host's report and beats topics (one partition each), created when missing;
    returns the report topic. Its nodes read the pool log, so they have no work view."""
    topics = {host_report_topic(names.prefix, host): {"retention.ms": str(REPORT_RETENTION_MS)},
              host_beats_topic(names.prefix, host): {"retention.ms": str(BEATS_RETENTION_MS)}}
    await _ensure_topics(where, topics, f"run `gpusched kafka-setup --node-host {host}` as the admin first",
                         replication_factor, min_insync_replicas, timeout_s)
    return host_report_topic(names.prefix, host)


async def _ensure_topics(where: Where, topics: dict[str, dict[str, str]], hint: str, replication_factor: int,
                         min_insync_replicas: int, timeout_s: float) -> None:
    admin = AIOKafkaAdminClient(**client_args(where), request_timeout_ms=15000)
    deadline = time.monotonic() + timeout_s
    try:
        await admin.start()
        present = set(await admin.list_topics())
        missing = [t for t in topics if t not in present]
        if missing:
            brokers = len((await admin.describe_cluster()).get("brokers") or ())
            rf, isr = replication_for(brokers, replication_factor, min_insync_replicas)
            for topic in missing:
                spec = NewTopic(topic, 1, rf, topic_configs={**topics[topic], "min.insync.replicas": str(isr)})
                await _create(admin, spec, hint, deadline, timeout_s)
    finally:
        await admin.close()


async def _create(admin: AIOKafkaAdminClient, spec: NewTopic, hint: str, deadline: float,
                  timeout_s: float) -> None:
    """Create one topic (already there is fine) and wait until it has a leader."""
    topic = spec.name
    while True:
        resp = await admin.create_topics([spec], timeout_ms=15000)
        _, code, *rest = resp.topic_errors[0]
        if code == 0 or for_code(code) is TopicAlreadyExistsError:
            break
        if code in _NOT_ALLOWED:
            raise PermissionError(f"topic {topic} does not exist and this Kafka principal may not create it: {hint}")
        if time.monotonic() > deadline:
            raise for_code(code)(f"creating topic {topic!r}: {rest[0] if rest else ''}")
        await asyncio.sleep(0.5)
    while not any(t.get("partitions") and all(p["leader"] >= 0 for p in t["partitions"])
                  for t in await admin.describe_topics([topic]) if t["error_code"] == 0):
        if time.monotonic() > deadline:
            raise TimeoutError(f"topic {topic} not ready after {timeout_s}s")
        await asyncio.sleep(0.2)


async def add_node(admin_connection: Where, names: TopicNames, node: str, password: str = "",
                   timeout_s: float = 30.0, reads_log: bool = False) -> str:
    """As the admin: the node's report and beats topics, its SCRAM user with ``password`` (a random
    one when empty) and its ACLs; returns the password. Idempotent: running it again
    sets the password anew. ``reads_log``: its agent folds the pool log (``--source
    log``) and may read it; otherwise it reads its work view only, and a READ of the pool
    log granted before is taken back."""
    return await _add_principal(admin_connection, names, node, password, timeout_s,
                                ensure_node_topics, node_principal, partial(grant_node_acls, reads_log=reads_log))


async def add_host(admin_connection: Where, names: TopicNames, host: str, password: str = "",
                   timeout_s: float = 30.0) -> str:
    """As the admin: a node host's topics, its SCRAM user ``node-host.<host>`` and its ACLs
    (``add_node`` for a host of simulated nodes); returns the password."""
    return await _add_principal(admin_connection, names, host, password, timeout_s,
                                ensure_host_topics, host_principal, grant_host_acls)


async def _add_principal(admin_connection: Where, names: TopicNames, name: str, password: str, timeout_s: float,
                         ensure_topics, principal_of, grant_acls) -> str:
    """A node's or host's topics, then (on a secured broker) its user, ACLs, and a login
    that works with them; the password ("" on a plaintext broker)."""
    admin = connection(admin_connection)
    await ensure_topics(admin, names, name)
    if not admin.secured:
        return ""
    password = password or secrets.token_hex(16)
    principal = principal_of(name)
    await set_scram_password(admin, principal, password)
    await grant_acls(admin, names, name, timeout_s)
    await _until_login_works(admin.as_user(principal, password), timeout_s)
    return password


class _UpsertResponse(Response):
    API_KEY = 51
    API_VERSION = 0
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        ("results", CompactArray(("user", CompactString("utf-8")), ("error_code", Int16),
                                 ("error_message", CompactString("utf-8")), ("tags", TaggedFields))),
        ("tags", TaggedFields),
    )


class _UpsertRequest_v0(RequestStruct):
    # AlterUserScramCredentials v0 (KIP-554), which aiokafka does not ship.
    FLEXIBLE_VERSION = True
    API_KEY = 51
    API_VERSION = 0
    RESPONSE_TYPE = _UpsertResponse
    SCHEMA = Schema(
        ("deletions", CompactArray(("name", CompactString("utf-8")), ("mechanism", Int8), ("tags", TaggedFields))),
        ("upsertions", CompactArray(("name", CompactString("utf-8")), ("mechanism", Int8), ("iterations", Int32),
                                    ("salt", CompactBytes), ("salted_password", CompactBytes),
                                    ("tags", TaggedFields))),
        ("tags", TaggedFields),
    )


class _Upsert(Request[_UpsertRequest_v0]):
    API_KEY = 51

    def __init__(self, upsertions: list[tuple]) -> None:
        self._upsertions = upsertions

    def build(self, request_struct_class: type[_UpsertRequest_v0]) -> _UpsertRequest_v0:
        return request_struct_class([], self._upsertions, {})


def salted_upsertion(user: str, password: str, mechanism: str = "SCRAM-SHA-512") -> tuple:
    """The upsertion entry: the broker stores only the salted password (RFC 5802's Hi)."""
    code, digest = _MECHANISMS[mechanism]
    salt = secrets.token_bytes(32)
    salted = hashlib.pbkdf2_hmac(digest, password.encode(), salt, SCRAM_ITERATIONS)
    return (user, code, SCRAM_ITERATIONS, salt, salted, {})


async def set_scram_password(admin_connection: Where, user: str, password: str, mechanism: str = "") -> None:
    """Create or update a SCRAM user's credential of ``mechanism`` (default: the
    connection's), leaving its credential of the other mechanism as it is; needs the admin."""
    conn = connection(admin_connection)
    admin = AIOKafkaAdminClient(**client_args(conn), request_timeout_ms=15000)
    try:
        await admin.start()
        reply = await admin._send_request(_Upsert([salted_upsertion(user, password, mechanism or conn.sasl_mechanism)]))
    finally:
        await admin.close()
    for name, code, message, _ in reply.results:
        if code:
            raise PermissionError(f"creating Kafka user {name}: {for_code(code).__name__}: {message}")


async def add_service_user(admin_connection: Where, principal: str, password: str = "", mechanism: str = "",
                           timeout_s: float = 30.0) -> str:
    """As the admin: a service's SCRAM credential of ``mechanism`` (default: the admin
    connection's) with ``password`` (a random one when empty), once every broker takes the
    login; returns the password. Its ACLs are the deployment's (``grant_service_acls``).
    Setting the other mechanism's credential leaves this one working: how a service's
    password is rotated without a moment in which neither logs in (docs/guide/deploying.md)."""
    admin = connection(admin_connection)
    password = password or secrets.token_hex(16)
    await set_scram_password(admin, principal, password, mechanism)
    login = replace(admin.as_user(principal, password), sasl_mechanism=mechanism or admin.sasl_mechanism)
    await _until_login_works(login, timeout_s)
    return password


async def _until_login_works(conn: KafkaConnection, timeout_s: float) -> None:
    """SCRAM users reach each broker through the metadata log: wait until every
    bootstrap broker accepts the login."""
    deadline = time.monotonic() + timeout_s
    for address in conn.bootstrap.split(","):
        while True:
            try:
                await check_login(replace(conn, bootstrap=address.strip()))
                break
            except KafkaLoginRefused:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)
