"""``gpusched-node-agent``: one process per node, NVML or simulated GPUs."""
from __future__ import annotations

import argparse
import asyncio
import socket
import uuid

from gpusched.adapters.eventlog import LogFollower, partition_for
from gpusched.adapters.gpu_health import NvmlWatch, SimulatedNvml
from gpusched.adapters.gpu_inventory import InventoryError, nvml_gpus, simulated_gpus
from gpusched.adapters.grpc_server import set_serving, start_server
from gpusched.adapters.service import connect, stop_event
from gpusched.adapters.tracing import setup_tracing
from gpusched.config import add_kafka_args, kafka_settings
from gpusched.core.model import NodeInfo
from gpusched.v1 import node_agent_pb2_grpc
from gpusched_node_agent.agent import NodeAgent
from gpusched_node_agent.api import NodeAgentServicer
from gpusched_node_agent.devices import MigManager, load_nvml, mps_running

SERVICES = ["gpusched.v1.NodeAgentService"]


def node_info(args: argparse.Namespace, nvml=None) -> NodeInfo:
    name = args.name or socket.gethostname()
    gpus = simulated_gpus(args.simulate, name) if args.simulate else nvml_gpus(nvml)
    labels = tuple(sorted(tuple(label.split("=", 1)) for label in args.label))
    return NodeInfo(
        name=name, pool=args.pool,
        cpu_milli=args.cpu_milli or 16_000 * max(1, len(gpus)),
        memory_mib=args.memory_mib or 131_072 * max(1, len(gpus)),
        gpus=gpus, labels=labels, simulated=bool(args.simulate), agent_id=uuid.uuid4().hex[:12],
        dynamic_mig=args.dynamic_mig and not args.simulate,
        mps=not args.simulate and (args.mps == "on" or (args.mps == "auto" and mps_running())),
    )


async def run(args: argparse.Namespace) -> None:
    settings = kafka_settings(args)
    setup_tracing("gpusched-node-agent")
    try:
        nvml = load_nvml(args.fake_nvml)
        info = node_info(args, nvml)
    except (InventoryError, ValueError) as exc:
        raise SystemExit(f"gpusched-node-agent: {exc}")
    me = f"node-agent-{info.name}-{info.agent_id}"
    publisher, dead_letters = await connect(settings, me)
    agent = NodeAgent(info, publisher, me, grace_s=args.grace)
    agent.mig = MigManager(info, nvml) if info.dynamic_mig else None
    backend = SimulatedNvml() if info.simulated else NvmlWatch(len(info.gpus), nvml=nvml)
    follower = LogFollower(settings.bootstrap, settings.topics, me, dead_letters, on_event=agent.on_event,
                           partitions=[partition_for(info.pool, settings.partitions)], freeze_state=True)
    servicer = NodeAgentServicer(agent, backend)
    server, port, health = await start_server(args.listen, [
        lambda s: node_agent_pb2_grpc.add_NodeAgentServiceServicer_to_server(servicer, s)], SERVICES)
    await follower.start()
    await agent.join(follower)
    await set_serving(health, SERVICES)
    print(f"node-agent ready node={info.name} gpus={len(info.gpus)} simulated={info.simulated} port={port}", flush=True)
    stop = stop_event()
    tasks = [asyncio.create_task(agent.heartbeats(args.heartbeat_interval, stop)),
             asyncio.create_task(agent.watch_health(backend))]
    await stop.wait()
    backend.stop()
    for task in tasks:
        task.cancel()
    await server.stop(grace=1)
    await follower.stop()
    await publisher.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="gpusched-node-agent", description=__doc__)
    add_kafka_args(parser)
    parser.add_argument("--name", default="", help="node name (default: host name)")
    parser.add_argument("--pool", default="default")
    parser.add_argument("--simulate", default="", help="simulated GPUs, e.g. 8xH100-80GB (default: NVML)")
    parser.add_argument("--cpu-milli", type=int, default=0)
    parser.add_argument("--memory-mib", type=int, default=0)
    parser.add_argument("--label", action="append", default=[], help="topology label, e.g. rack=r1")
    parser.add_argument("--heartbeat-interval", type=float, default=1.0)
    parser.add_argument("--grace", type=float, default=10.0, help="seconds a stopped workload has to checkpoint")
    parser.add_argument("--listen", default="127.0.0.1:0", help="health endpoint")
    parser.add_argument("--dynamic-mig", action="store_true",
                        help="create and destroy MIG instances to fit placed slices (default: existing instances only)")
    parser.add_argument("--mps", choices=("auto", "on", "off"), default="auto",
                        help="whether the CUDA MPS daemon runs here (auto: look for its control pipe)")
    parser.add_argument("--fake-nvml", default="", metavar="SPEC.json",
                        help="test harness: GPUs come from a fake NVML described by SPEC.json, not the driver")
    asyncio.run(run(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
