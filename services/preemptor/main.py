"""``gpusched-preemptor``: preemption, quota reclaim, defragmentation and supervision."""
from __future__ import annotations

import argparse
import asyncio

from gpusched.adapters.eventlog import LogFollower
from gpusched.adapters.grpc_server import set_serving, start_server
from gpusched.adapters.heartbeats import HeartbeatMonitor
from gpusched.adapters.proposer import PartitionProposer
from gpusched.adapters.service import connect, instance_id, stop_event
from gpusched.adapters.tracing import setup_tracing
from gpusched.config import add_kafka_args, add_security_args, kafka_settings, server_security
from gpusched.policies.preemption import PreemptionConfig
from gpusched.policies.supervision import SupervisionConfig
from gpusched_preemptor.decide import PreemptorDecider


async def run(args: argparse.Namespace) -> None:
    settings = kafka_settings(args)
    security = server_security(args)   # before connecting: a bad setting stops at once
    setup_tracing("gpusched-preemptor")
    me = instance_id("preemptor")
    publisher, dead_letters = await connect(settings, me)
    monitor = HeartbeatMonitor(
        settings.connection, settings.topics,
        lambda value, key: publisher.send_raw(settings.topics.heartbeats, value, key=key))
    await monitor.start()
    decider = PreemptorDecider(
        me, PreemptionConfig(min_runtime_s=args.min_runtime),   # quotas: the log's
        SupervisionConfig(heartbeat_timeout_s=args.heartbeat_timeout, hang_intervals=args.hang_intervals,
                          hang_grace_s=args.hang_grace),
        lambda now: (monitor.last_seen, monitor.since, monitor.hearing(now)), defrag=not args.no_defrag)
    holder: dict = {}
    follower = LogFollower(
        settings.connection, settings.topics, me, dead_letters, group_id=f"{settings.topic_prefix}preemptor",
        on_assigned=lambda parts: holder["loop"].on_assigned(parts),
        on_revoked=lambda parts: holder["loop"].on_revoked(parts), freeze_state=True,
    )
    loop = holder["loop"] = PartitionProposer(follower, publisher, decider, me)
    server, port, health = await start_server(args.listen, [], [], security)
    await follower.start()
    await set_serving(health, [])
    print(f"preemptor ready port={port} id={me}", flush=True)
    stop = stop_event()
    task = asyncio.create_task(loop.run(stop))
    await stop.wait()
    task.cancel()
    await server.stop(grace=1)
    await follower.stop()
    await monitor.stop()
    await publisher.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="gpusched-preemptor", description=__doc__)
    add_kafka_args(parser)
    add_security_args(parser)
    parser.add_argument("--listen", default="127.0.0.1:0", help="health endpoint")
    parser.add_argument("--heartbeat-timeout", type=float, default=10.0, help="seconds of silence before NodeLost")
    parser.add_argument("--min-runtime", type=float, default=30.0, help="jobs younger than this are not preempted")
    parser.add_argument("--hang-intervals", type=float, default=3.0)
    parser.add_argument("--hang-grace", type=float, default=30.0)
    parser.add_argument("--no-defrag", action="store_true", help="do not migrate jobs to defragment")
    asyncio.run(run(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
