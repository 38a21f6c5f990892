"""Kafka ACLs of a gpusched deployment: one principal per service, each allowed only
what it needs (``gpusched.adapters.broker.kafka_principals`` lists them with their grants;
docs/reference/kafka-security.md has the table and the reasons).

The broker (``deploy/kafka.sh`` with ``GPUSCHED_KAFKA_SECURITY=sasl_ssl``) runs the
``StandardAuthorizer`` with ``allow.everyone.if.no.acl.found=false``: what no ACL allows
is refused. ACLs name the topics of one prefix literally (the report topics of one prefix
by that prefix), so deployments (and tests) sharing a cluster under different prefixes
cannot touch each other's topics.

Node-agents log in one principal per node, ``node-agent.<node>``: ``node_acl_entries``
lets each write only its own report and beats topics, never the pool log, the shared
heartbeats or usage; the relay appends what it validated (``gpusched.adapters.nodes.relay``),
the preemptor reads the beats topics itself. Each reads only its own work view
(``<prefix>work.<node>``), which the relay writes, not the pool log: that holds every
team's job specs, commands and submitters, and a node runs users' code. Only a node
whose agent folds the pool log itself (``--source log``) is granted it
(``reads_log``). A node host (many simulated nodes in one process, which fold the pool
log) logs in as ``node-host.<host>`` and writes only its own ``hostreports.<host>`` and
``hostbeats.<host>`` (``host_acl_entries``).
"""
from __future__ import annotations

import asyncio
import time
from collections import defaultdict

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.protocol.admin import CreateAclsRequest_v1, DeleteAclsRequest_v1, DescribeAclsRequest_v1
from aiokafka.protocol.api import Request

from gpusched.adapters.broker.kafka_admin import TopicNames
from gpusched.adapters.broker.kafka_principals import GRANTS, Grant
from gpusched.adapters.broker.kafka_security import Where, client_args
from gpusched.adapters.nodes.reports import (BEATS, HOST_BEATS, HOST_REPORTS, REPORTS, beats_topic, host_beats_topic,
                                       host_principal, host_report_topic, node_principal, report_topic)
from gpusched.adapters.nodes.work_view import WORK, work_topic

# Kafka protocol codes (org.apache.kafka.common.acl / resource).
_TOPIC, _GROUP, _CLUSTER = 2, 3, 4
_LITERAL, _PREFIXED = 3, 4
_ALLOW = 3
_ANY = 1
READ, WRITE, DESCRIBE, DESCRIBE_CONFIGS, IDEMPOTENT_WRITE = 3, 4, 8, 10, 12

# GRANTS, the services' ACLs, come from the one list of the broker's users
# (gpusched.adapters.broker.kafka_principals.PRINCIPALS); "nobody" (a valid login with no role)
# gets nothing, the admin is a super user (topics and ACLs).

# What every node's own principal gets besides its report and beats topics and its work
# view: it dead-letters what it cannot apply. Its beats and usage records go on its own
# topics (docs/reference/kafka-security.md), no shared one.
NODE_GRANT = Grant(writes=("dead_letters",))
# A node whose agent folds its pool's log itself (``--source log``), and a node host.
LOG_READER_GRANT = Grant(reads=("events",), writes=("dead_letters",))


def node_acl_entries(names: TopicNames, node: str, reads_log: bool = False) -> list[tuple]:
    """The ACLs of one node's principal: ``NODE_GRANT`` (``LOG_READER_GRANT`` when
    ``reads_log``) plus WRITE and DESCRIBE on its own report and beats topics and READ on
    its own work view, nothing on any other node's."""
    principal = f"User:{node_principal(node)}"
    out = acl_entries(names, {node_principal(node): LOG_READER_GRANT if reads_log else NODE_GRANT})
    for topic in (report_topic(names.prefix, node), beats_topic(names.prefix, node)):
        out += [(_TOPIC, topic, _LITERAL, principal, "*", op, _ALLOW) for op in (DESCRIBE, DESCRIBE_CONFIGS, WRITE)]
    out += [(_TOPIC, work_topic(names.prefix, node), _LITERAL, principal, "*", op, _ALLOW)
            for op in (DESCRIBE, DESCRIBE_CONFIGS, READ)]
    return out


def host_acl_entries(names: TopicNames, host: str) -> list[tuple]:
    """The ACLs of a node host's principal ``node-host.<host>``: ``LOG_READER_GRANT`` (its
    simulated nodes fold the pool log) plus WRITE and DESCRIBE on its own report and beats
    topics; the relay and the preemptor let it speak only for nodes named ``<host>-...``
    (gpusched.adapters.nodes.reports.hosted_by)."""
    principal = f"User:{host_principal(host)}"
    out = acl_entries(names, {host_principal(host): LOG_READER_GRANT})
    for topic in (host_report_topic(names.prefix, host), host_beats_topic(names.prefix, host)):
        out += [(_TOPIC, topic, _LITERAL, principal, "*", op, _ALLOW) for op in (DESCRIBE, DESCRIBE_CONFIGS, WRITE)]
    return out


def acl_entries(names: TopicNames, grants: dict[str, Grant] = GRANTS) -> list[tuple]:
    """CreateAcls v1 entries: (resource type, name, pattern, principal, host, operation,
    permission). Every service may also see every topic's metadata and configs (it checks
    at start that the topics exist and are replicated as configured)."""
    out = []
    for user, grant in grants.items():
        principal = f"User:{user}"
        for every, kind in ((grant.reads_reports, REPORTS), (grant.reads_beats, BEATS),
                            (grant.reads_reports, HOST_REPORTS), (grant.reads_beats, HOST_BEATS)):
            if every:
                out += [(_TOPIC, names.prefix + kind, _PREFIXED, principal, "*", op, _ALLOW) for op in (READ, DESCRIBE)]
        if grant.writes_work:
            out += [(_TOPIC, names.prefix + WORK, _PREFIXED, principal, "*", op, _ALLOW) for op in (WRITE, DESCRIBE)]
        for attr in names_all_attrs():
            for op in (DESCRIBE, DESCRIBE_CONFIGS):
                out.append((_TOPIC, getattr(names, attr), _LITERAL, principal, "*", op, _ALLOW))
        for attr in grant.reads:
            out.append((_TOPIC, getattr(names, attr), _LITERAL, principal, "*", READ, _ALLOW))
        for attr in grant.writes:
            out.append((_TOPIC, getattr(names, attr), _LITERAL, principal, "*", WRITE, _ALLOW))
        if grant.writes:
            # Producers are idempotent (acks=all without duplicates): getting a producer id
            # is a cluster operation. It allows no write by itself.
            out.append((_CLUSTER, "kafka-cluster", _LITERAL, principal, "*", IDEMPOTENT_WRITE, _ALLOW))
        for group in grant.groups:
            out.append((_GROUP, names.prefix + group, _LITERAL, principal, "*", READ, _ALLOW))
    return out


def names_all_attrs() -> tuple[str, ...]:
    return ("events", "heartbeats", "dead_letters", "snapshots", "usage")


class _CreateAcls(Request[CreateAclsRequest_v1]):
    # aiokafka's CreateAclsRequest sends one ACL per request; this sends all at once.
    API_KEY = 30

    def __init__(self, creations: list[tuple]) -> None:
        self._creations = creations

    def build(self, request_struct_class: type[CreateAclsRequest_v1]) -> CreateAclsRequest_v1:
        return request_struct_class(self._creations)


class _DeleteAcls(Request[DeleteAclsRequest_v1]):
    API_KEY = 31

    def __init__(self, filters: list[tuple]) -> None:
        self._filters = filters

    def build(self, request_struct_class: type[DeleteAclsRequest_v1]) -> DeleteAclsRequest_v1:
        return request_struct_class(self._filters)


class _DescribeAcls(Request[DescribeAclsRequest_v1]):
    API_KEY = 29

    def __init__(self, resource_type: int, name: str, pattern: int = _LITERAL) -> None:
        self._filter = (resource_type, name, pattern, None, None, _ANY, _ANY)

    def build(self, request_struct_class: type[DescribeAclsRequest_v1]) -> DescribeAclsRequest_v1:
        return request_struct_class(*self._filter)


class AclError(RuntimeError):
    """The broker refused to create an ACL (the caller is not the admin?)."""


async def grant_service_acls(admin_connection: Where, names: TopicNames, timeout_s: float = 30.0) -> int:
    """Create the ACLs of ``GRANTS`` for the topics of ``names`` (idempotent: an existing
    ACL is created again without error). Needs the admin principal. Returns how many."""
    return await create_acls(admin_connection, acl_entries(names), names.prefix + "*", timeout_s)


async def grant_node_acls(admin_connection: Where, names: TopicNames, node: str, timeout_s: float = 30.0,
                          reads_log: bool = False) -> int:
    """Create the ACLs of one node's principal (``node_acl_entries``); needs the admin.
    Without ``reads_log`` a READ of the pool log granted before is deleted: running the
    setup again for a node takes that back."""
    created = await create_acls(admin_connection, node_acl_entries(names, node, reads_log), node_principal(node),
                                timeout_s)
    if not reads_log:
        await delete_acls(admin_connection, [(_TOPIC, names.events, _LITERAL, f"User:{node_principal(node)}", "*",
                                              READ, _ALLOW)], timeout_s)
    return created


async def grant_host_acls(admin_connection: Where, names: TopicNames, host: str, timeout_s: float = 30.0) -> int:
    """Create the ACLs of one node host's principal (``host_acl_entries``); needs the admin."""
    return await create_acls(admin_connection, host_acl_entries(names, host), host_principal(host), timeout_s)


async def create_acls(admin_connection: Where, entries: list[tuple], what: str, timeout_s: float = 30.0) -> int:
    """Create ``entries`` and wait until every broker shows them; how many."""
    admin = AIOKafkaAdminClient(**client_args(admin_connection), request_timeout_ms=15000)
    try:
        await admin.start()
        response = await admin._send_request(_CreateAcls(entries))
        errors = [(code, msg) for code, msg in response.creation_responses if code]
        if errors:
            raise AclError(f"creating {len(entries)} ACLs for {what}: {errors[0]}")
        await _until_every_broker_has(admin, entries, timeout_s)
    finally:
        await admin.close()
    return len(entries)


async def delete_acls(admin_connection: Where, entries: list[tuple], timeout_s: float = 30.0) -> None:
    """Delete the ACLs ``entries`` name exactly (absent ones are fine) and wait until no
    broker shows them any more; needs the admin."""
    admin = AIOKafkaAdminClient(**client_args(admin_connection), request_timeout_ms=15000)
    try:
        await admin.start()
        response = await admin._send_request(_DeleteAcls(entries))
        errors = [result for result in response.filter_responses if result[0]]
        if errors:
            raise AclError(f"deleting {len(entries)} ACLs: {errors[0][:2]}")
        await _until_every_broker_has(admin, entries, timeout_s, present=False)
    finally:
        await admin.close()


async def _until_every_broker_has(admin: AIOKafkaAdminClient, entries: list[tuple], timeout_s: float,
                                  present: bool = True) -> None:
    """ACLs reach each broker's authorizer through the metadata log, a little after the
    controller accepted them: wait until every broker lists them all (``present``; none
    of them, once deleted), so that a service started next is not refused (or allowed)
    by a broker that lags."""
    want: dict[tuple, set] = defaultdict(set)
    for rtype, name, pattern, principal, _, op, _ in entries:
        want[(rtype, name, pattern)].add((principal, op))
    deadline = time.monotonic() + timeout_s
    for broker in admin._client.cluster.brokers():
        for (rtype, name, pattern), acls in want.items():
            while True:
                reply = await admin._send_request(_DescribeAcls(rtype, name, pattern), broker.nodeId)
                shown = {(acl[0], acl[2]) for r in reply.resources for acl in r[3]}
                if acls <= shown if present else not acls & shown:
                    break
                if time.monotonic() > deadline:
                    raise AclError(f"broker {broker.nodeId} still does not show the ACLs of {name} as "
                                   f"{'created' if present else 'deleted'} after {timeout_s}s")
                await asyncio.sleep(0.05)   # another broker's metadata: nothing to await but a poll
