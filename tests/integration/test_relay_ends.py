"""The relay's ordering check asks the pool log's end offsets only for a report it would
otherwise refuse (gpusched/adapters/nodes/relay.py): a report about a job the fold already
placed goes on with no ListOffsets request, and one about a job whose JobPlaced the fold
has not applied yet waits for the fold to cover the log and is relayed, not refused."""
from __future__ import annotations

import time
import uuid

from aiokafka import AIOKafkaProducer

from gpusched.adapters.log import codec
from gpusched.adapters.log.follower import FollowerOptions, LogFollower
from gpusched.adapters.broker.kafka_security import client_args
from gpusched.adapters.nodes.node_access import ensure_node_topics
from gpusched.adapters.log.publisher import DeadLetters, EventPublisher, partition_for
from gpusched.adapters.nodes.relay import Relay
from gpusched.core import events as ev
from tests.polling import eventually_async
from tests.unit.core.builders import make_node, make_spec, whole, workers

PARTITIONS = 4


def _event(cls, **fields) -> ev.Event:
    return cls(event_id=f"e-{uuid.uuid4().hex}", time=time.time(), producer="test", **fields)


async def _place(publisher: EventPublisher, job_id: str, gpu: int) -> None:
    """Submit ``job_id`` and place its one worker on n1's GPU ``gpu``, straight into the pool log."""
    for event in (_event(ev.JobSubmitted, job_id=job_id, spec=make_spec()),
                  _event(ev.JobPlaced, job_id=job_id, attempt=0, workers=workers(("n1", whole(gpu))))):
        await (await publisher.send(event, "default"))


async def test_reports_on_folded_jobs_ask_no_ends_and_a_lagging_fold_is_waited_for(kafka_bootstrap, topics):
    report_topic = await ensure_node_topics(kafka_bootstrap, topics, "n1")
    publisher = EventPublisher(kafka_bootstrap, topics, PARTITIONS)
    await publisher.start()
    dead_letters = DeadLetters(publisher, "relay-ends-test")
    follower = LogFollower(kafka_bootstrap, topics, "relay-ends-test", dead_letters, FollowerOptions())
    await follower.start()
    relay = Relay(kafka_bootstrap, topics, PARTITIONS, follower, publisher, dead_letters, "relay-ends-test")
    agent = AIOKafkaProducer(**client_args(kafka_bootstrap), acks="all")
    await agent.start()
    state = lambda: follower.states[partition_for("default", PARTITIONS)]   # noqa: E731

    async def report(job_id: str) -> None:
        started = _event(ev.WorkerStarted, job_id=job_id, attempt=0, worker=0, node="n1")
        await agent.send_and_wait(report_topic, codec.encode(started, "default"), key=b"default")

    try:
        await follower.caught_up()
        await relay.start()
        await (await publisher.send(_event(ev.NodeRegistered, node=make_node("n1", gpus=8)), "default"))
        await _place(publisher, "folded", 0)
        await eventually_async(lambda: "folded" in state().jobs and state().jobs["folded"].workers,
                               "the placement of 'folded' in the fold")
        # The fold has the placement: the report passes as the fold is, no request.
        await report("folded")
        await eventually_async(lambda: 0 in state().jobs["folded"].started, "the start of 'folded' relayed")
        assert relay.counts["end_asks"] == 0
        assert relay.counts["relayed"] == 1

        # The fold lags the log (its fetches paused): the placement is in the log, the
        # relay reads the report first, asks the ends once and waits for the fold.
        follower._consumer.pause(*follower._consumer.assignment())
        await _place(publisher, "lagging", 1)
        await report("lagging")
        await eventually_async(lambda: relay.counts["end_asks"] == 1, "the relay to ask for an end")
        assert "lagging" not in state().jobs and relay.counts["relayed"] == 1
        follower._consumer.resume(*follower._consumer.assignment())
        await eventually_async(lambda: "lagging" in state().jobs and 0 in state().jobs["lagging"].started,
                               "the start of 'lagging' relayed")
        assert relay.counts["refused"] == 0
        assert relay.counts["relayed"] == 2
        assert relay.counts["end_asks"] == 1
    finally:
        await relay.stop()
        await agent.stop()
        await follower.stop()
        await publisher.stop()
