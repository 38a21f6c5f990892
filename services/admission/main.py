"""``gpusched-admission``: the job API in front of the pool logs."""
from __future__ import annotations

import argparse
import asyncio
import logging

from gpusched.adapters.eventlog import LogFollower
from gpusched.adapters.grpc_server import set_serving, start_server
from gpusched.adapters.service import connect, instance_id, stop_event
from gpusched.adapters.tracing import setup_tracing
from gpusched.config import add_kafka_args, kafka_settings
from gpusched.core import events as ev
from gpusched.v1 import admission_pb2_grpc, cluster_pb2_grpc
from gpusched_admission.servicer import AdmissionServicer, ClusterServicer, ReadModel
from gpusched_admission.watch import Watchers

log = logging.getLogger("gpusched.admission")
SERVICES = ["gpusched.v1.AdmissionService", "gpusched.v1.ClusterService"]


async def run(args: argparse.Namespace) -> None:
    settings = kafka_settings(args)
    setup_tracing("gpusched-admission")
    me = instance_id("admission")
    publisher, dead_letters = await connect(settings, me)
    watchers = Watchers()
    holder: dict = {}

    def on_event(partition, offset, event, outcome, state):
        admission = holder.get("admission")
        if admission is not None:
            admission.note_outcome(event, outcome.accepted)
            if outcome.accepted and type(event) is ev.NodeRegistered:
                admission.model.inventory_changes += 1
        if outcome.accepted:
            for job_id in outcome.jobs:
                watchers.publish(state.jobs[job_id], type(event).__name__, offset)

    # Admission answers for every pool, so it follows every partition (no group).
    follower = LogFollower(settings.bootstrap, settings.topics, me, dead_letters, on_event=on_event,
                           freeze_state=True, retention_s=settings.job_retention_s)
    await follower.start()
    model = ReadModel(follower, settings.partitions)
    admission = holder["admission"] = AdmissionServicer(model, publisher, me, watchers)
    cluster = ClusterServicer(model, publisher, me)
    server, port, health = await start_server(args.listen, [
        lambda s: admission_pb2_grpc.add_AdmissionServiceServicer_to_server(admission, s),
        lambda s: cluster_pb2_grpc.add_ClusterServiceServicer_to_server(cluster, s),
    ], SERVICES)
    await follower.caught_up()
    await set_serving(health, SERVICES)
    log.info("admission %s serving on port %d", me, port)
    print(f"admission ready port={port}", flush=True)
    await stop_event().wait()
    await set_serving(health, SERVICES, False)
    await server.stop(grace=2)
    await follower.stop()
    await publisher.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="gpusched-admission", description=__doc__)
    add_kafka_args(parser)
    parser.add_argument("--listen", default="127.0.0.1:50051")
    asyncio.run(run(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
