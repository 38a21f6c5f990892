"""``gpusched node-host``: many simulated nodes in one process (``gpusched_node_agent.host``),
for benchmarks and for a large cluster on a laptop. Real nodes keep one agent each."""
from __future__ import annotations

import argparse
import asyncio
import socket
import uuid

from gpusched.adapters.log.follower import FollowerOptions, LogFollower
from gpusched.adapters.gpus.gpu_inventory import InventoryError, simulated_gpus
from gpusched.adapters.broker.kafka_admin import TopicNames
from gpusched.adapters.broker.kafka_security import KafkaConnection
from gpusched.adapters.telemetry.metrics import setup_metrics
from gpusched.adapters.nodes.node_access import ensure_host_topics
from gpusched.adapters.log.publisher import partition_for
from gpusched.adapters.nodes.reports import check_node_name, host_beats_topic, hosted_node_name
from gpusched.adapters.service import connect, stop_event
from gpusched.config import KafkaSettings, NodeHostSettings, kafka_settings, settings_or_exit
from gpusched.core.model import NodeInfo
from gpusched_node_agent.agent import RelayTimeout
from gpusched_node_agent.host import NodeHost


def hosted_infos(own: NodeHostSettings, host: str) -> list[NodeInfo]:
    """Every node of the host, as a node-agent with ``--simulate`` would describe it."""
    labels = tuple(sorted(tuple(label.split("=", 1)) for label in own.label))
    infos = []
    for index in range(own.nodes):
        name = hosted_node_name(host, index)
        gpus = simulated_gpus(own.simulate, name)
        infos.append(NodeInfo(name=name, pool=own.pool, cpu_milli=16_000 * len(gpus), memory_mib=131_072 * len(gpus),
                              gpus=gpus, labels=labels, simulated=True, agent_id=uuid.uuid4().hex[:12],
                              address="127.0.0.1", lease_s=0.0, kill_wait_s=own.grace))
    return infos


async def run(args: argparse.Namespace) -> None:
    settings = kafka_settings(args)
    conn, topics = KafkaConnection.from_settings(settings), TopicNames(settings.topic_prefix)
    own = settings_or_exit(NodeHostSettings, args)
    try:
        host = check_node_name(own.name or socket.gethostname().split(".")[0])
        infos = hosted_infos(own, host)
    except (InventoryError, ValueError) as exc:
        raise SystemExit(f"gpusched node-host: {exc}")
    me = f"node-host-{host}-{uuid.uuid4().hex[:8]}"
    publisher, dead_letters = await connect(settings, me)
    try:
        report_topic = await ensure_host_topics(conn, topics, host, replication_factor=settings.replication_factor,
                                                min_insync_replicas=settings.min_insync_replicas)
    except (PermissionError, ValueError) as exc:
        raise SystemExit(f"{me}: {exc}") from None
    node_host = NodeHost(host, infos, publisher, me, report_topic=report_topic,
                         beats_topic=host_beats_topic(topics.prefix, host), grace_s=own.grace)
    options = FollowerOptions(partitions=(partition_for(own.pool, settings.partitions),), freeze_state=True,
                              parallel_replay_min=settings.parallel_replay_min)
    follower = LogFollower(conn, topics, me, dead_letters, options, on_event=node_host.on_event)
    setup_metrics("gpusched-node-host", follower)
    stop = stop_event()
    await follower.start()
    # Beats first: a node registering is heard from at once, as a node-agent's first beat.
    beats = asyncio.create_task(node_host.beats(own.heartbeat_interval, stop))
    try:
        await node_host.join(follower, own.join_concurrency)
    except RelayTimeout as exc:
        raise SystemExit(f"{me}: {exc}") from None
    print(f"node-host ready host={host} nodes={len(infos)} gpus={len(infos[0].gpus)} pool={own.pool}", flush=True)
    await stop.wait()
    beats.cancel()
    await follower.stop()
    await publisher.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="gpusched node-host", description=__doc__.split("\n\n")[0])
    KafkaSettings.add_args(parser)
    NodeHostSettings.add_args(parser, title="this host and its simulated nodes")
    asyncio.run(run(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
