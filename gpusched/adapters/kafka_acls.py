"""Kafka ACLs of a gpusched deployment: one principal per service, each allowed only
what it needs (docs/kafka-security.md has the table and the reasons).

The broker (``deploy/kafka.sh`` with ``GPUSCHED_KAFKA_SECURITY=sasl_ssl``) runs the
``StandardAuthorizer`` with ``allow.everyone.if.no.acl.found=false``: what no ACL allows
is refused. ACLs name the topics of one prefix literally, so deployments (and tests)
sharing a cluster under different prefixes cannot touch each other's topics.
"""
from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.protocol.admin import CreateAclsRequest_v1, DescribeAclsRequest_v1
from aiokafka.protocol.api import Request

from gpusched.adapters.kafka_admin import TopicNames
from gpusched.adapters.kafka_security import Where, client_args

# Kafka protocol codes (org.apache.kafka.common.acl / resource).
_TOPIC, _GROUP, _CLUSTER = 2, 3, 4
_LITERAL = 3
_ALLOW = 3
_ANY = 1
READ, WRITE, DESCRIBE, DESCRIBE_CONFIGS, IDEMPOTENT_WRITE = 3, 4, 8, 10, 12


@dataclass(frozen=True)
class Grant:
    """What one principal may do: topics (by ``TopicNames`` attribute) it reads and
    writes, and consumer groups (a suffix of the prefix) it joins."""

    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()


# Read from the code: who produces to and consumes from which topic. Every writer also
# dead-letters what it cannot apply. Billing and audit read only; "nobody" (a valid login
# with no role) gets nothing, the admin is a super user (topics and ACLs).
GRANTS: dict[str, Grant] = {
    "admission": Grant(reads=("events",), writes=("events", "dead_letters")),
    "placer": Grant(reads=("events", "snapshots"), writes=("events", "snapshots", "dead_letters"),
                    groups=("placer",)),
    # The preemptor's heartbeat monitor sends probe beats through the topic to know its
    # own consumer hears (gpusched/adapters/heartbeats.py), hence its write on heartbeats.
    "preemptor": Grant(reads=("events", "heartbeats"), writes=("events", "heartbeats", "dead_letters"),
                       groups=("preemptor",)),
    "node-agent": Grant(reads=("events",), writes=("events", "heartbeats", "usage", "dead_letters")),
    # Their consumers (gpusched.consumers.stream) commit offsets in a group of their name.
    "billing": Grant(reads=("events", "usage"), groups=("billing",)),
    "audit": Grant(reads=("events", "heartbeats", "dead_letters", "snapshots", "usage"), groups=("audit",)),
}


def acl_entries(names: TopicNames, grants: dict[str, Grant] = GRANTS) -> list[tuple]:
    """CreateAcls v1 entries: (resource type, name, pattern, principal, host, operation,
    permission). Every service may also see every topic's metadata and configs (it checks
    at start that the topics exist and are replicated as configured)."""
    out = []
    for user, grant in grants.items():
        principal = f"User:{user}"
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


class _DescribeAcls(Request[DescribeAclsRequest_v1]):
    API_KEY = 29

    def __init__(self, resource_type: int, name: str) -> None:
        self._filter = (resource_type, name, _LITERAL, None, None, _ANY, _ANY)

    def build(self, request_struct_class: type[DescribeAclsRequest_v1]) -> DescribeAclsRequest_v1:
        return request_struct_class(*self._filter)


class AclError(RuntimeError):
    """The broker refused to create an ACL (the caller is not the admin?)."""


async def grant_service_acls(admin_connection: Where, names: TopicNames, timeout_s: float = 30.0) -> int:
    """Create the ACLs of ``GRANTS`` for the topics of ``names`` (idempotent: an existing
    ACL is created again without error). Needs the admin principal. Returns how many."""
    entries = acl_entries(names)
    admin = AIOKafkaAdminClient(**client_args(admin_connection), request_timeout_ms=15000)
    try:
        await admin.start()
        response = await admin._send_request(_CreateAcls(entries))
        errors = [(code, msg) for code, msg in response.creation_responses if code]
        if errors:
            raise AclError(f"creating {len(entries)} ACLs for {names.prefix}*: {errors[0]}")
        await _until_every_broker_has(admin, entries, timeout_s)
    finally:
        await admin.close()
    return len(entries)


async def _until_every_broker_has(admin: AIOKafkaAdminClient, entries: list[tuple], timeout_s: float) -> None:
    """ACLs reach each broker's authorizer through the metadata log, a little after the
    controller accepted them: wait until every broker lists them all, so that a service
    started next is not refused by a broker that lags."""
    want = Counter((e[0], e[1]) for e in entries)
    deadline = time.monotonic() + timeout_s
    for broker in admin._client.cluster.brokers():
        for (rtype, name), count in want.items():
            while True:
                reply = await admin._send_request(_DescribeAcls(rtype, name), broker.nodeId)
                if sum(len(r[3]) for r in reply.resources) >= count:
                    break
                if time.monotonic() > deadline:
                    raise AclError(f"broker {broker.nodeId} does not show the ACLs of {name} after {timeout_s}s")
                await asyncio.sleep(0.05)
