"""``gpusched-node-agent``: one process per node, NVML or simulated GPUs."""
from __future__ import annotations

import argparse
import asyncio
import socket
import tempfile
import uuid
from pathlib import Path

from gpusched.adapters.log.follower import FollowerOptions, LogFollower
from gpusched.adapters.log.publisher import partition_for
from gpusched.adapters.gpus.gpu_health import NvmlWatch, SimulatedNvml
from gpusched.adapters.gpus.gpu_inventory import InventoryError, nvml_gpus, simulated_gpus
from gpusched.adapters.api.grpc_server import set_serving, start_server
from gpusched.adapters.nodes.node_access import ensure_node_topics
from gpusched.adapters.service import connect, stop_event
from gpusched.adapters.telemetry.metrics import setup_metrics
from gpusched.adapters.telemetry.tracing import setup_tracing
from gpusched.adapters.broker.kafka_admin import TopicNames
from gpusched.adapters.broker.kafka_security import KafkaConnection
from gpusched.adapters.api.server_security import server_security_from_args
from gpusched.config import KafkaSettings, NodeAgentSettings, SecuritySettings, kafka_settings, settings_or_exit
from gpusched.core.model import NodeInfo
from gpusched.v1 import node_agent_pb2_grpc
from gpusched_node_agent import shim_process
from gpusched_node_agent.agent import NodeAgent, RelayTimeout
from gpusched_node_agent.api import NodeAgentServicer
from gpusched_node_agent.devices import MigManager, load_nvml, mps_running
from gpusched_node_agent.usage import usage_rules, usage_tasks
from gpusched_node_agent.work_source import WorkSource

SERVICES = ["gpusched.v1.NodeAgentService"]


def node_info(own: NodeAgentSettings, nvml=None) -> NodeInfo:
    name = own.name or socket.gethostname()
    gpus = simulated_gpus(own.simulate, name) if own.simulate else nvml_gpus(nvml)
    labels = tuple(sorted(tuple(label.split("=", 1)) for label in own.label))
    return NodeInfo(
        name=name, pool=own.pool,
        cpu_milli=own.cpu_milli or 16_000 * max(1, len(gpus)),
        memory_mib=own.memory_mib or 131_072 * max(1, len(gpus)),
        gpus=gpus, labels=labels, simulated=bool(own.simulate), agent_id=uuid.uuid4().hex[:12],
        address=own.address or default_address(),
        # Simulated runs hold no process: nothing to fence, a lost node's work is gone.
        lease_s=own.lease if real_processes(own) else 0.0, kill_wait_s=own.grace,
        dynamic_mig=own.dynamic_mig and not own.simulate,
        mps=not own.simulate and (own.mps == "on" or (own.mps == "auto" and mps_running())),
    )


def make_source(own: NodeAgentSettings, conn, topics: TopicNames, settings: KafkaSettings, info: NodeInfo, me: str,
                dead_letters, agent: NodeAgent):
    """What the agent reads (``--source``): its pool's log, folded whole, or its node's work view."""
    if own.source == "view":
        return WorkSource(conn, topics, info.name, me, dead_letters, agent.on_view)
    options = FollowerOptions(partitions=(partition_for(info.pool, settings.partitions),), freeze_state=True,
                              parallel_replay_min=settings.parallel_replay_min)
    return LogFollower(conn, topics, me, dead_letters, options, on_event=agent.on_event)


def real_processes(own: NodeAgentSettings) -> bool:
    """Commands run as processes on NVML nodes, and on simulated ones with --run-processes."""
    return not own.simulate or own.run_processes


def default_address() -> str:
    """This host's address as its name resolves, for peers of a gang; loopback when the
    name does not resolve (a laptop)."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


async def run(args: argparse.Namespace) -> None:
    settings = kafka_settings(args)
    conn, topics = KafkaConnection.from_settings(settings), TopicNames(settings.topic_prefix)
    own = settings_or_exit(NodeAgentSettings, args)
    rules = usage_rules(own)
    if real_processes(own) and (why := shim_process.missing()):   # no worker could start: say so now
        raise SystemExit(f"gpusched-node-agent: {why}")
    security = server_security_from_args(args, own.listen)   # before connecting: a bad setting stops at once
    setup_tracing("gpusched-node-agent")
    try:
        nvml = load_nvml(own.fake_nvml)
        info = node_info(own, nvml)
    except (InventoryError, ValueError) as exc:
        raise SystemExit(f"gpusched-node-agent: {exc}")
    me = f"node-agent-{info.name}-{info.agent_id}"
    publisher, dead_letters = await connect(settings, me)
    try:
        report_topic = await ensure_node_topics(conn, topics, info.name,
                                                replication_factor=settings.replication_factor,
                                                min_insync_replicas=settings.min_insync_replicas)
    except (PermissionError, ValueError) as exc:   # not set up for this node: say how
        raise SystemExit(f"{me}: {exc}") from None
    state_dir = Path(own.state_dir or Path(tempfile.gettempdir()) / f"gpusched-node-{info.name}")
    state_dir.mkdir(parents=True, exist_ok=True)
    agent = NodeAgent(info, publisher, me, report_topic=report_topic, state_dir=state_dir, grace_s=own.grace,
                      drain_s=own.drain,
                      real_processes=real_processes(own))
    agent.mig = MigManager(info, nvml) if info.dynamic_mig else None
    backend = SimulatedNvml() if info.simulated else NvmlWatch(len(info.gpus), nvml=nvml)
    follower = make_source(own, conn, topics, settings, info, me, dead_letters, agent)
    servicer = NodeAgentServicer(agent, backend)
    server, port, health = await start_server(own.listen, [
        lambda s: node_agent_pb2_grpc.add_NodeAgentServiceServicer_to_server(servicer, s)], SERVICES, security)
    setup_metrics("gpusched-node-agent", follower if isinstance(follower, LogFollower) else None)
    await follower.start()
    try:
        await agent.join(follower)
    except RelayTimeout as exc:   # nothing relays our reports: say so, no traceback
        views = " and writes work views (not --no-work-views; or run this agent with --source log)"
        raise SystemExit(f"{me}: {exc}" + (views if own.source == "view" else "")) from None
    await set_serving(health, SERVICES)
    print(f"node-agent ready node={info.name} gpus={len(info.gpus)} simulated={info.simulated} port={port}", flush=True)
    stop = stop_event()
    tasks = [asyncio.create_task(agent.heartbeats(own.heartbeat_interval, stop)),
             asyncio.create_task(agent.watch_health(backend))]
    tasks += usage_tasks(agent, own.usage_interval, rules, stop)
    await stop.wait()
    backend.stop()
    for task in tasks:
        task.cancel()
    await server.stop(grace=1)
    await follower.stop()
    await publisher.stop()   # the workers' shims run on, fenced by the lease


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpusched-node-agent", description=__doc__)
    KafkaSettings.add_args(parser)
    SecuritySettings.add_args(parser, title="API security (docs/reference/security.md)")
    NodeAgentSettings.add_args(parser, title="this node")
    return parser


def main(argv: list[str] | None = None) -> None:
    asyncio.run(run(parser().parse_args(argv)))


if __name__ == "__main__":
    main()
