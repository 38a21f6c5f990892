"""``gpusched relay``: node-agents' reports into the pool log, on its own
(``gpusched.adapters.nodes.relay``). Admission runs the same relay unless started with
``--no-relay``; run this where the relay should scale or fail apart from the job API.
Replicas share the work through the consumer group ``<prefix>relay``."""
from __future__ import annotations

import argparse
import asyncio


async def run(args: argparse.Namespace) -> None:
    from gpusched.adapters.log.follower import FollowerOptions, LogFollower
    from gpusched.adapters.broker.kafka_admin import TopicNames
    from gpusched.adapters.broker.kafka_security import KafkaConnection
    from gpusched.adapters.telemetry.metrics import setup_metrics
    from gpusched.adapters.nodes.relay import Relay
    from gpusched.adapters.nodes.work_writer import WorkViewWriter
    from gpusched.adapters.service import connect, instance_id, stop_event
    from gpusched.config import AdmissionSettings, kafka_settings, settings_or_exit

    settings = kafka_settings(args)
    conn, topics = KafkaConnection.from_settings(settings), TopicNames(settings.topic_prefix)
    me = instance_id("relay")
    publisher, dead_letters = await connect(settings, me)
    own = settings_or_exit(AdmissionSettings, args)
    # Each node's work view, from the same fold, unless ``--no-work-views``.
    views = None if own.no_work_views else WorkViewWriter(conn, topics, publisher, me)
    follower = LogFollower(conn, topics, me, dead_letters,
                           FollowerOptions(freeze_state=True, parallel_replay_min=settings.parallel_replay_min),
                           on_event=views.on_event if views is not None else None)
    setup_metrics("gpusched-relay", follower)
    await follower.start()
    await follower.caught_up()
    relay = Relay(conn, topics, settings.partitions, follower, publisher, dead_letters, me)
    await relay.start()
    if views is not None:
        await views.start(follower.states)
    print(f"relay ready name={me}", flush=True)
    await stop_event().wait()
    await relay.stop()
    if views is not None:
        await views.stop()
    await follower.stop()
    await publisher.stop()


def main(argv: list[str] | None = None) -> None:
    from gpusched.config import AdmissionSettings, KafkaSettings

    parser = argparse.ArgumentParser(prog="gpusched relay", description=__doc__.split("\n\n")[0])
    KafkaSettings.add_args(parser)
    AdmissionSettings.add_args(parser, only=("no_work_views",))
    asyncio.run(run(parser.parse_args(argv)))
