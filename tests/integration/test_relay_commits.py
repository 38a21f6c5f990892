"""The relay's commits of the reports it handled (gpusched/adapters/nodes/relay.py): the
offsets of every batch relayed within ``COMMIT_INTERVAL_S`` go in one commit, not one
commit request per report, and a stop commits what is left, so a relay that stops
cleanly leaves nothing for its successor to read again."""
from __future__ import annotations

import time

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from gpusched.adapters.nodes import relay as relay_module
from gpusched.adapters.log.follower import FollowerOptions, LogFollower
from gpusched.adapters.broker.kafka_security import client_args
from gpusched.adapters.nodes.node_access import ensure_node_topics
from gpusched.adapters.log.publisher import DeadLetters, EventPublisher
from gpusched.adapters.nodes.relay import Relay
from tests.polling import eventually_async

REPORTS = 12


async def test_reports_handled_one_by_one_share_commits_and_a_stop_commits_the_rest(kafka_bootstrap, topics):
    report_topic = await ensure_node_topics(kafka_bootstrap, topics, "n1")
    publisher = EventPublisher(kafka_bootstrap, topics, 4)
    await publisher.start()
    dead_letters = DeadLetters(publisher, "relay-test")
    follower = LogFollower(kafka_bootstrap, topics, "relay-test", dead_letters, FollowerOptions())
    await follower.start()
    relay = Relay(kafka_bootstrap, topics, 4, follower, publisher, dead_letters, "relay-test")
    producer = AIOKafkaProducer(**client_args(kafka_bootstrap), acks="all")
    await producer.start()
    try:
        await follower.caught_up()
        await relay.start()
        # Records that are no event: each is refused (dead-lettered) and committed like any
        # report. One at a time, each handled before the next is written: one batch each.
        began = time.monotonic()
        for i in range(REPORTS):
            await producer.send_and_wait(report_topic, b"not an event", key=b"default")
            await eventually_async(lambda: relay.counts["refused"] == i + 1, f"report {i} refused")   # no event
        took = time.monotonic() - began
        commits = relay.counts["commits"]
        assert commits < REPORTS
        assert commits <= 2 + took / relay_module.COMMIT_INTERVAL_S, (commits, took)
        await relay.stop()
    finally:
        await producer.stop()
        await follower.stop()
        await publisher.stop()

    reader = AIOKafkaConsumer(**client_args(kafka_bootstrap), group_id=topics.prefix + "relay",
                              enable_auto_commit=False)
    await reader.start()
    try:
        assert await reader.committed(TopicPartition(report_topic, 0)) == REPORTS
    finally:
        await reader.stop()
