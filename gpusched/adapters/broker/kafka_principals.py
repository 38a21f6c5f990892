"""The Kafka principals of a gpusched deployment, written once: each SCRAM user of the
broker, the commands that log in as it, what it may do and why (docs/reference/kafka-security.md).

Everything else is generated from ``PRINCIPALS``:

* ``deploy/kafka.sh`` makes one SCRAM user and password for each, with the names
  ``python -m gpusched.adapters.broker.kafka_principals`` prints (one a line);
* ``gpusched.adapters.broker.kafka_acls`` grants each its ACLs (``GRANTS``);
* ``gpusched kafka-setup --service NAME`` sets the password of a service's principal
  (``SERVICES``);
* ``gpusched.local_cluster`` starts each command logged in as its principal
  (``principal_of_command``); the systemd units' environment files name the same.

Node-agents and node hosts are not here: each logs in as its own principal
(``node-agent.<node>``, ``node-host.<host>``: ``gpusched.adapters.nodes.reports``), made per
node by ``gpusched kafka-setup --node``/``--node-host``.

Imports nothing but the standard library: ``deploy/kafka.sh`` runs it from the checkout
with whatever python3 it finds, before the package or its dependencies are installed.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Grant:
    """What one principal may do: topics (by ``TopicNames`` attribute) it reads and
    writes, and consumer groups (a suffix of the prefix) it joins
    (``gpusched.adapters.broker.kafka_acls.acl_entries`` makes the ACLs)."""

    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()
    reads_reports: bool = False   # every node's report topic of the prefix (the relay)
    reads_beats: bool = False     # every node's beats topic of the prefix (the preemptor)
    writes_work: bool = False     # every node's work view (the relay: gpusched.adapters.nodes.work_writer)


@dataclass(frozen=True)
class Principal:
    """One SCRAM user of the broker. ``commands``: the gpusched commands
    (``gpusched.commands.COMMANDS``) that log in as it; ``grant``: its ACLs, None for
    none (the super user needs none; ``nobody`` gets none)."""

    name: str
    purpose: str
    commands: tuple[str, ...] = ()
    grant: Grant | None = None
    super_user: bool = False


# Grants read from the code: who produces to and consumes from which topic. Every writer
# also dead-letters what it cannot apply. Billing and audit read only.
PRINCIPALS: tuple[Principal, ...] = (
    Principal("admin", "super user: creates topics, alters configs, ACLs, SCRAM users; never used by a service",
              commands=("kafka-setup",), super_user=True),
    # Admission runs the relay (gpusched.adapters.nodes.relay) unless started with --no-relay;
    # the relay forwards the usage records it checked.
    Principal("admission", "folds the pool logs, appends submissions and cancels; runs the relay",
              commands=("admission",),
              grant=Grant(reads=("events",), writes=("events", "usage", "dead_letters"), groups=("relay",),
                          reads_reports=True, writes_work=True)),
    # The placer writes the pool log's dead letters, once each: it reads the topic first.
    Principal("placer", "appends placements, writes snapshots and the pool log's dead letters",
              commands=("placer",),
              grant=Grant(reads=("events", "snapshots", "dead_letters"),
                          writes=("events", "snapshots", "dead_letters"), groups=("placer",))),
    # The preemptor's heartbeat monitor reads every node's beats topic, and sends probe
    # beats through <prefix>heartbeats to know its own consumer hears
    # (gpusched/adapters/nodes/heartbeats.py), hence its write there. Its autoscaler reads
    # the replicas' load from the usage records (gpusched/adapters/nodes/replica_loads.py).
    Principal("preemptor", "appends preemptions, node loss and scales; reads every node's beats and the usage",
              commands=("preemptor",),
              grant=Grant(reads=("events", "heartbeats", "usage"), writes=("events", "heartbeats", "dead_letters"),
                          groups=("preemptor",), reads_beats=True)),
    # The relay on its own (``gpusched relay``): what admission needs for it.
    Principal("relay", "the relay on its own: the nodes' reports into the pool log, their work views",
              commands=("relay",),
              grant=Grant(reads=("events",), writes=("events", "usage", "dead_letters"), groups=("relay",),
                          reads_reports=True, writes_work=True)),
    # Their consumers (gpusched.consumers.stream) commit offsets in a group of their name.
    Principal("billing", "read only: the billing consumer", commands=("billing-consumer",),
              grant=Grant(reads=("events", "usage"), groups=("billing",))),
    # The auditor reads every topic, the nodes' own report and beats topics included: what
    # a node sent, forged records too, is part of who did what.
    Principal("audit", "read only: the audit consumer, the usage report", commands=("audit-consumer", "usage"),
              grant=Grant(reads=("events", "heartbeats", "dead_letters", "snapshots", "usage"), groups=("audit",),
                          reads_reports=True, reads_beats=True)),
    Principal("nobody", "a valid login with no role: refused everything (tests check it)"),
)

NAMES: tuple[str, ...] = tuple(p.name for p in PRINCIPALS)
SUPER_USER: str = next(p.name for p in PRINCIPALS if p.super_user)
# The ACLs of the services' principals (``kafka_acls.grant_service_acls``).
GRANTS: dict[str, Grant] = {p.name: p.grant for p in PRINCIPALS if p.grant is not None}
# The principals whose password ``gpusched kafka-setup --service`` sets.
SERVICES: tuple[str, ...] = tuple(GRANTS)


def principal_of_command(command: str) -> str | None:
    """The principal that gpusched command ``command`` (``gpusched.commands.COMMANDS``)
    logs in as; None for a command not in the table (a node's own, or none)."""
    return next((p.name for p in PRINCIPALS if command in p.commands), None)


def main(argv: list[str] | None = None) -> int:
    """Print the principals' names, one a line (what ``deploy/kafka.sh`` makes users of)."""
    args = sys.argv[1:] if argv is None else argv
    if args:
        print("usage: python -m gpusched.adapters.broker.kafka_principals  (prints the Kafka principals, one a line)",
              file=sys.stderr)
        return 2
    print("\n".join(NAMES))
    return 0


if __name__ == "__main__":
    sys.exit(main())
