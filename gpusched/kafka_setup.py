"""``gpusched kafka-setup``: create a deployment's topics and its services' ACLs, as the
Kafka admin principal (docs/reference/kafka-security.md). Services do not create topics on a secured
cluster: their principals may not. Run it once per topic prefix, and again after changing
``--replication-factor``/``--min-insync-replicas`` (it reports what it cannot change).

``--node NAME`` (repeatable) adds a node: its report topic and, on a secured cluster, its
own SCRAM user ``node-agent.NAME`` with a new random password, written to
``--node-secrets DIR/node-agent.NAME`` (mode 600), and its ACLs. Give that file to the
node's agent (``--kafka-user node-agent.NAME --kafka-password-file ...``). Running it again
for a node sets a new password: that is how a node's login is rotated or revoked. A node's
login reads its own work view, not the pool log (which holds every team's job specs and
commands); ``--node-reads-log NAME`` adds a node whose agent runs with ``--source log``
and so may read its pool's log (running ``--node NAME`` again takes that back).
``--node-host NAME`` does the same for a node host (``gpusched node-host``): its topics
``hostreports.NAME`` and ``hostbeats.NAME`` and its user ``node-host.NAME``.

``--service NAME`` (repeatable: a service's principal, ``kafka_principals.SERVICES``) sets
that service's SCRAM credential to a new random password, written to ``--secrets DIR/NAME``
(mode 600), for the mechanism ``--scram-mechanism`` (default: the admin's). A user has
one credential per mechanism: setting the other mechanism's leaves the one in use
working, so a service's password is rotated without downtime by alternating mechanisms
(docs/guide/deploying.md, "Rotating logins, certificates and tokens")."""
from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path

from gpusched.adapters.broker.kafka_principals import SERVICES


async def setup(args: argparse.Namespace) -> int:
    from gpusched.adapters.broker.kafka_acls import AclError, grant_service_acls
    from gpusched.adapters.broker.kafka_admin import TopicNames, ensure_topics, wait_for_broker
    from gpusched.adapters.broker.kafka_security import KafkaConnection, KafkaLoginRefused
    from gpusched.config import kafka_settings

    settings = kafka_settings(args)
    conn, topics = KafkaConnection.from_settings(settings), TopicNames(settings.topic_prefix)
    try:
        await wait_for_broker(conn, args.connect_timeout)
        problems = await ensure_topics(conn, topics, settings.partitions,
                                       replication_factor=settings.replication_factor,
                                       min_insync_replicas=settings.min_insync_replicas)
        acls = await grant_service_acls(conn, topics) if conn.secured else 0
        nodes = [await _add_node(conn, topics, node, Path(args.secrets)) for node in args.node]
        nodes += [await _add_node(conn, topics, node, Path(args.secrets), reads_log=True)
                  for node in args.node_reads_log]
        nodes += [await _add_node(conn, topics, host, Path(args.secrets), host=True) for host in args.node_host]
        nodes += [await _add_service(conn, service, args.scram_mechanism, Path(args.secrets)) for service in args.service]
    except (KafkaLoginRefused, TimeoutError, PermissionError, AclError, ValueError) as exc:
        print(f"gpusched kafka-setup: {exc}")
        return 1
    print(f"topics {settings.topic_prefix}* ready on {conn}; {acls} ACLs"
          + "".join(f"\n  {line}" for line in problems) + "".join(f"\n  {line}" for line in nodes))
    return 0


async def _add_node(conn, topics, node: str, secrets_dir: Path, host: bool = False, reads_log: bool = False) -> str:
    from gpusched.adapters.nodes.node_access import add_host, add_node
    from gpusched.adapters.nodes.reports import (beats_topic, host_beats_topic, host_principal, host_report_topic,
                                           node_principal, report_topic)

    if host:
        password = await add_host(conn, topics, node)
        made = f"node host {node}: topics {host_report_topic(topics.prefix, node)}, " \
               f"{host_beats_topic(topics.prefix, node)}"
        user = host_principal(node)
    else:
        password = await add_node(conn, topics, node, reads_log=reads_log)
        made = f"node {node}: topics {report_topic(topics.prefix, node)}, {beats_topic(topics.prefix, node)}" \
               + (" (its agent may read the pool log: --source log)" if reads_log else "")
        user = node_principal(node)
    if not conn.secured:
        return made
    return f"{made}, user {user}, password in {_write_secret(secrets_dir, user, password)}"


async def _add_service(conn, service: str, mechanism: str, secrets_dir: Path) -> str:
    from gpusched.adapters.nodes.node_access import add_service_user

    if not conn.secured:
        raise ValueError(f"--service {service}: the broker takes no logins (not SASL_SSL)")
    password = await add_service_user(conn, service, mechanism=mechanism)
    return (f"service {service}: {mechanism or conn.sasl_mechanism} credential, password in "
            f"{_write_secret(secrets_dir, service, password)}")


def _write_secret(secrets_dir: Path, user: str, password: str) -> Path:
    secrets_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = secrets_dir / user
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(password + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    from gpusched.config import KafkaSettings

    parser = argparse.ArgumentParser(prog="gpusched kafka-setup", description=__doc__.split("\n\n")[0])
    KafkaSettings.add_args(parser)
    parser.add_argument("--connect-timeout", type=float, default=60.0)
    parser.add_argument("--node", action="append", default=[], metavar="NAME",
                        help="add a node: its report topic, Kafka user node-agent.NAME and ACLs (repeatable)")
    parser.add_argument("--node-reads-log", action="append", default=[], metavar="NAME",
                        help="add a node whose agent runs with --source log: as --node, and it may read its "
                             "pool's log (every team's jobs); the exception, not the rule (repeatable)")
    parser.add_argument("--node-host", action="append", default=[], metavar="NAME",
                        help="add a node host: its topics, Kafka user node-host.NAME and ACLs (repeatable)")
    parser.add_argument("--service", action="append", default=[], choices=SERVICES,
                        help="set the service's SCRAM credential to a new password (repeatable)")
    parser.add_argument("--scram-mechanism", default="", choices=("SCRAM-SHA-512", "SCRAM-SHA-256"),
                        help="the mechanism of the services' new credentials (default: the admin login's)")
    parser.add_argument("--secrets", "--node-secrets", dest="secrets", default="node-secrets", metavar="DIR",
                        help="where the new passwords are written, one file per user")
    return asyncio.run(setup(parser.parse_args(argv)))
