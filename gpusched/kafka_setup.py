"""``gpusched kafka-setup``: create a deployment's topics and its services' ACLs, as the
Kafka admin principal (docs/kafka-security.md). Services do not create topics on a secured
cluster: their principals may not. Run it once per topic prefix, and again after changing
``--replication-factor``/``--min-insync-replicas`` (it reports what it cannot change)."""
from __future__ import annotations

import argparse
import asyncio


async def setup(args: argparse.Namespace) -> int:
    from gpusched.adapters.kafka_acls import AclError, grant_service_acls
    from gpusched.adapters.kafka_admin import TopicNames, ensure_topics, wait_for_broker
    from gpusched.adapters.kafka_security import KafkaConnection, KafkaLoginRefused
    from gpusched.config import kafka_settings

    settings = kafka_settings(args)
    conn, topics = KafkaConnection.from_settings(settings), TopicNames(settings.topic_prefix)
    try:
        await wait_for_broker(conn, args.connect_timeout)
        problems = await ensure_topics(conn, topics, settings.partitions,
                                       replication_factor=settings.replication_factor,
                                       min_insync_replicas=settings.min_insync_replicas)
        acls = await grant_service_acls(conn, topics) if conn.secured else 0
    except (KafkaLoginRefused, TimeoutError, PermissionError, AclError) as exc:
        print(f"gpusched kafka-setup: {exc}")
        return 1
    print(f"topics {settings.topic_prefix}* ready on {conn}; {acls} ACLs"
          + "".join(f"\n  {line}" for line in problems))
    return 0


def main(argv: list[str] | None = None) -> int:
    from gpusched.config import KafkaSettings

    parser = argparse.ArgumentParser(prog="gpusched kafka-setup", description=__doc__.split("\n\n")[0])
    KafkaSettings.add_args(parser)
    parser.add_argument("--connect-timeout", type=float, default=60.0)
    return asyncio.run(setup(parser.parse_args(argv)))
