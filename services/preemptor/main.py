"""``gpusched-preemptor``: supervision, preemption, quota reclaim and defragmentation, as the
actions ``--actions`` names, in its order (``gpusched.policies.actions``)."""
from __future__ import annotations

import argparse
import asyncio
import dataclasses

from gpusched.adapters.log.follower import FollowerOptions, LogFollower
from gpusched.adapters.api.grpc_server import set_serving, start_server
from gpusched.adapters.nodes.heartbeats import HeartbeatMonitor
from gpusched.adapters.nodes.replica_loads import ReplicaLoadReader
from gpusched.adapters.log.proposer import PartitionProposer
from gpusched.adapters.service import connect, instance_id, stop_event
from gpusched.adapters.telemetry.metrics import setup_metrics
from gpusched.adapters.telemetry.tracing import setup_tracing
from gpusched.adapters.broker.kafka_admin import TopicNames
from gpusched.adapters.broker.kafka_security import KafkaConnection
from gpusched.adapters.api.server_security import server_security_from_args
from gpusched.config import KafkaSettings, PreemptorSettings, SecuritySettings, kafka_settings, settings_or_exit
from gpusched.policies.actions import make_actions
from gpusched.policies.preemption.victim_rules import PreemptionConfig
from gpusched.policies.supervision import SupervisionConfig
from gpusched_preemptor.decide import PreemptorDecider
from gpusched_preemptor.spans import traced

# The share of the time the preemptor's rounds may take (``PartitionProposer``): a round
# looks for room for each pending job it examines, and in a burst of submissions rounds
# would otherwise run back to back beside the placer and the relay.
BUSY_SHARE = 0.25


def preemption_config(own: PreemptorSettings) -> PreemptionConfig:
    """The preemption rules of the settings: each field of ``PreemptionConfig`` from the
    setting of its name (a field in seconds, ``..._s``, from the setting without the
    suffix), so a rule's new setting needs nothing here; the others keep their defaults,
    and the quota tree comes from the log."""
    given = own.model_dump()
    values = {}
    for field in dataclasses.fields(PreemptionConfig):
        name = field.name.removesuffix("_s")
        if name in given:
            values[field.name] = given[name]
    return PreemptionConfig(**values)


def revoked(decider: PreemptorDecider, loop: PartitionProposer, partitions: set[int]) -> None:
    """The consumer group took ``partitions`` away: the loop stops deciding on them and the
    decider drops what it kept for them (``PreemptorDecider.revoked``)."""
    loop.on_revoked(partitions)
    decider.revoked(partitions)


async def run(args: argparse.Namespace) -> None:
    settings = kafka_settings(args)
    conn, topics = KafkaConnection.from_settings(settings), TopicNames(settings.topic_prefix)
    own = settings_or_exit(PreemptorSettings, args)
    try:
        actions = make_actions(own.action_names)
    except ValueError as exc:
        raise SystemExit(f"invalid settings: {PreemptorSettings.error('actions', str(exc))}") from None
    security = server_security_from_args(args, own.listen)   # before connecting: a bad setting stops at once
    setup_tracing("gpusched-preemptor")
    me = instance_id("preemptor")
    publisher, dead_letters = await connect(settings, me)
    monitor = HeartbeatMonitor(
        conn, topics,
        lambda value, key: publisher.send_raw(topics.heartbeats, value, key=key))
    await monitor.start()
    loads = None
    if any(a.name == "autoscale" for a in actions):   # the replicas' load, from the usage topic
        loads = ReplicaLoadReader(conn, topics)
        await loads.start()
    decider = PreemptorDecider(
        me, preemption_config(own),   # quotas: the log's
        SupervisionConfig(heartbeat_timeout_s=own.heartbeat_timeout, hang_intervals=own.hang_intervals,
                          hang_grace_s=own.hang_grace),
        lambda now: (monitor.last_seen, monitor.since, monitor.hearing(now)), actions,
        loads.loads if loads is not None else None)
    holder: dict = {}
    options = FollowerOptions(group_id=f"{settings.topic_prefix}preemptor", freeze_state=True,
                              parallel_replay_min=settings.parallel_replay_min)
    follower = LogFollower(conn, topics, me, dead_letters, options,
                           on_assigned=lambda parts: holder["loop"].on_assigned(parts),
                           on_revoked=lambda parts: revoked(decider, holder["loop"], parts))
    loop = holder["loop"] = PartitionProposer(follower, publisher, traced(decider), me, busy_share=BUSY_SHARE)
    server, port, health = await start_server(own.listen, [], [], security)
    setup_metrics("gpusched-preemptor", follower)
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
    if loads is not None:
        await loads.stop()
    await publisher.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="gpusched-preemptor", description=__doc__)
    KafkaSettings.add_args(parser)
    SecuritySettings.add_args(parser, title="API security (docs/reference/security.md)")
    PreemptorSettings.add_args(parser)
    asyncio.run(run(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
