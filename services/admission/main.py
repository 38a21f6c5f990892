"""``gpusched-admission``: the job API in front of the pool logs."""
from __future__ import annotations

import argparse
import asyncio
import logging
import time
import uuid

from gpusched.adapters.log.follower import FollowerOptions, LogFollower
from gpusched.adapters.log.publisher import EventPublisher
from gpusched.adapters.api.grpc_server import set_serving, start_server
from gpusched.adapters.nodes.relay import Relay
from gpusched.adapters.nodes.work_writer import WorkViewWriter
from gpusched.adapters.service import connect, instance_id, stop_event
from gpusched.adapters.telemetry.metrics import count_outcome, setup_metrics
from gpusched.adapters.telemetry.tracing import setup_tracing
from gpusched.adapters.broker.kafka_admin import TopicNames
from gpusched.adapters.broker.kafka_security import KafkaConnection
from gpusched.adapters.api.server_security import server_security_from_args
from gpusched.config import AdmissionSettings, KafkaSettings, SecuritySettings, kafka_settings, settings_or_exit
from gpusched.core import events as ev
from gpusched.v1 import admission_pb2_grpc, cluster_pb2_grpc
from gpusched_admission.limits import SubmissionLimits
from gpusched_admission.policy_api import bootstrap_policy
from gpusched_admission.cluster_rpcs import ClusterServicer
from gpusched_admission.read_model import ReadModel, Submitters
from gpusched_admission.service_api import EndpointWatchers, ServiceApiServicer
from gpusched_admission.servicer import AdmissionServicer
from gpusched_admission.watch import Watchers

log = logging.getLogger("gpusched.admission")
SERVICES = ["gpusched.v1.AdmissionService", "gpusched.v1.ClusterService", "gpusched.v1.ServiceApi"]


async def run(args: argparse.Namespace) -> None:
    settings = kafka_settings(args)
    conn, topics = KafkaConnection.from_settings(settings), TopicNames(settings.topic_prefix)
    own = settings_or_exit(AdmissionSettings, args)
    security = server_security_from_args(args, own.listen)   # before connecting: a bad setting stops at once
    setup_tracing("gpusched-admission")
    me = instance_id("admission")
    publisher, dead_letters = await connect(settings, me)
    watchers = Watchers()
    endpoint_watchers = EndpointWatchers()
    holder: dict = {}
    submitters = Submitters()   # fed from the first event replayed, before the API exists
    limits = SubmissionLimits(own.submit_rate, own.submit_burst, own.max_pending_per_team)
    # The relay's fold also writes each node's work view (gpusched.adapters.nodes.work_writer),
    # what node-agents read by default; --no-work-views where every agent reads the log.
    views = None if own.no_work_views or own.no_relay else WorkViewWriter(conn, topics, publisher, me)

    def on_event(partition, offset, event, outcome, state):
        submitters.on_event(event, outcome, state)
        if views is not None:
            views.on_event(partition, offset, event, outcome, state)
        count_outcome(event, outcome, state)
        admission = holder.get("admission")
        if admission is not None:
            admission.note_outcome(event, outcome.accepted, outcome.reason)
            if outcome.accepted and type(event) is ev.NodeRegistered:
                admission.model.inventory_changes += 1
        services = holder.get("services")
        if services is not None:
            services.note_outcome(event, outcome.accepted, outcome.reason)
        if outcome.accepted:
            limits.pending.note(partition, state, outcome.jobs)
            for job_id in outcome.jobs:
                watchers.publish(state.jobs[job_id], type(event).__name__, offset)
            endpoint_watchers.on_event(partition, offset, state)

    # Admission answers for every pool, so it follows every partition (no group).
    follower = LogFollower(conn, topics, me, dead_letters,
                           FollowerOptions(freeze_state=True, parallel_replay_min=settings.parallel_replay_min), on_event=on_event)
    setup_metrics("gpusched-admission", follower)
    await follower.start()
    model = ReadModel(follower, settings.partitions, submitters)
    admission = holder["admission"] = AdmissionServicer(model, publisher, me, watchers, limits)
    cluster = ClusterServicer(model, publisher, me)
    services = holder["services"] = ServiceApiServicer(model, publisher, me, endpoint_watchers)
    server, port, health = await start_server(own.listen, [
        lambda s: admission_pb2_grpc.add_AdmissionServiceServicer_to_server(admission, s),
        lambda s: cluster_pb2_grpc.add_ClusterServiceServicer_to_server(cluster, s),
        lambda s: admission_pb2_grpc.add_ServiceApiServicer_to_server(services, s),
    ], SERVICES, security)
    await follower.caught_up()
    await record_retention(follower, publisher, me, own.job_retention)
    await bootstrap_policy(follower, publisher, me, settings.partitions, own.quotas)
    # Admission already folds every pool's log: the relay of node reports checks against it.
    relay = None if own.no_relay else Relay(conn, topics, settings.partitions,
                                             follower, publisher, dead_letters, me)
    if relay is not None:
        await relay.start()
    if views is not None:
        await views.start(follower.states)
    await set_serving(health, SERVICES)
    log.info("admission %s serving on port %d", me, port)
    print(f"admission ready port={port}", flush=True)
    await stop_event().wait()
    await set_serving(health, SERVICES, False)
    await server.stop(grace=2)
    if relay is not None:
        await relay.stop()
    if views is not None:
        await views.stop()
    await follower.stop()
    await publisher.stop()


async def record_retention(follower: LogFollower, publisher: EventPublisher, me: str, seconds: float) -> None:
    """Admission owns the job API, so its ``--job-retention`` is the cluster's: where a
    partition's log holds another value (or none: off), record this one there, and wait
    until it is folded. Every replica of every service then folds with the log's value."""
    for partition, state in sorted(follower.states.items()):
        if state.retention_s != seconds:
            log.info("recording a finished-job retention of %gs in partition %d (the log had %gs)",
                     seconds, partition, state.retention_s)
            event = ev.JobRetentionSet(event_id=uuid.uuid4().hex, time=time.time(), producer=me,
                                       job_retention_s=seconds)
            await follower.wait_applied(await publisher.publish_to(event, partition))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="gpusched-admission", description=__doc__)
    KafkaSettings.add_args(parser)
    SecuritySettings.add_args(parser, title="API security (docs/reference/security.md)")
    AdmissionSettings.add_args(parser)
    asyncio.run(run(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
