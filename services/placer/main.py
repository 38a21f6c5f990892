"""``gpusched-placer``: a consumer-group member that schedules the pools it owns."""
from __future__ import annotations

import argparse
import asyncio
import logging
import math

from gpusched.adapters.log.follower import FollowerOptions, LogFollower
from gpusched.adapters.api.grpc_server import set_serving, start_server
from gpusched.adapters.service import connect, instance_id, stop_event
from gpusched.adapters.telemetry.metrics import setup_metrics
from gpusched.adapters.telemetry.tracing import setup_tracing
from gpusched.adapters.broker.kafka_admin import TopicNames
from gpusched.adapters.broker.kafka_security import KafkaConnection
from gpusched.adapters.api.server_security import server_security_from_args
from gpusched.config import KafkaSettings, PlacerSettings, SecuritySettings, kafka_settings, settings_or_exit
from gpusched.policies.scheduler import Scheduler, SchedulerConfig
from gpusched.adapters.log.proposer import PartitionProposer
from gpusched.adapters.log.snapshots import SnapshotStore, SnapshotWriter
from gpusched_placer.cycle_log import CycleLog
from gpusched_placer.loop import PlacementDecider

log = logging.getLogger("gpusched.placer")


def scheduler_config(own: PlacerSettings) -> SchedulerConfig:
    """The scheduler the placer's settings describe (quotas and weights come from the log)."""
    return SchedulerConfig(
        queue=own.queue, placement=own.placement, placement_args=own.placement_args, backfill=own.backfill,
        reserve_after_s=own.reserve_after, pool_reserve_after_s=own.pool_reserve_after,
        reservation_depth=own.reservation_depth, default_estimate_s=own.default_estimate,
        guarantee_hold_s=own.guarantee_hold,
        max_job_test=own.max_job_test, job_test_head=own.job_test_head,
        max_cycle_s=own.max_cycle_ms / 1e3 if own.max_cycle_ms > 0 else math.inf, min_job_test=own.min_job_test)


async def run(args: argparse.Namespace) -> None:
    settings = kafka_settings(args)
    conn, topics = KafkaConnection.from_settings(settings), TopicNames(settings.topic_prefix)
    own = settings_or_exit(PlacerSettings, args)
    security = server_security_from_args(args, own.listen)   # before connecting: a bad setting stops at once
    setup_tracing("gpusched-placer")
    me = instance_id("placer")
    try:   # an unknown policy or argument stops the placer here, naming it
        scheduler = Scheduler(scheduler_config(own))
    except ValueError as exc:
        raise SystemExit(f"invalid settings: {exc} (--queue, --placement, --placement-arg, "
                         "--reserve-after, --pool-reserve-after, --reservation-depth)") from None
    # Quotas and weights come from the log (QuotaSet/TeamPolicySet, docs/reference/policy.md).
    publisher, dead_letters = await connect(settings, me, pool_log_letters=True)   # docs/design/architecture.md
    holder: dict = {}
    # Snapshots: a newly owned pool starts from its latest snapshot and replays the tail;
    # owned pools are snapshotted every N events / T seconds (and on a clean stop).
    snapshots = SnapshotStore(conn, topics, name=me)

    def revoked(parts: set[int]):
        holder["snapshots"].forget(parts)
        holder["decider"].forget(parts)
        return holder["loop"].on_revoked(parts)

    def assigned(parts: set[int]):
        holder["decider"].forget(parts)
        return holder["loop"].on_assigned(parts)

    options = FollowerOptions(group_id=f"{settings.topic_prefix}placer", use_snapshots=not own.no_snapshots,
                              freeze_state=True, parallel_replay_min=settings.parallel_replay_min)
    cycle_log = CycleLog.open(own.cycle_log)
    decider = holder["decider"] = PlacementDecider(scheduler, me, cycle_log)
    follower = LogFollower(conn, topics, me, dead_letters, options, on_event=decider.on_event,
                           on_assigned=assigned, on_revoked=revoked, snapshots=snapshots)
    writer = holder["snapshots"] = SnapshotWriter(follower, snapshots, own.snapshot_every_events,
                                                  own.snapshot_every_s, fork=not own.snapshot_in_thread)
    loop = holder["loop"] = PartitionProposer(follower, publisher, decider, me)
    server, port, health = await start_server(own.listen, [], [], security)
    setup_metrics("gpusched-placer", follower)
    await follower.start()
    await set_serving(health, [])
    print(f"placer ready port={port} id={me}", flush=True)
    stop = stop_event()
    task = asyncio.create_task(loop.run(stop))
    snapshot_task = asyncio.create_task(writer.run(stop)) if writer.enabled else None
    await stop.wait()
    task.cancel()
    if snapshot_task is not None:
        await asyncio.gather(snapshot_task, return_exceptions=True)
        await writer.flush()
    await server.stop(grace=1)
    await follower.stop()
    await snapshots.stop()
    await dead_letters.stop()
    await publisher.stop()
    if cycle_log is not None:
        cycle_log.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="gpusched-placer", description=__doc__)
    KafkaSettings.add_args(parser)
    SecuritySettings.add_args(parser, title="API security (docs/reference/security.md)")
    PlacerSettings.add_args(parser)
    asyncio.run(run(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
