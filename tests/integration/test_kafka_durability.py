"""Durability on a 3-broker cluster (replication factor 3, min.insync.replicas 2).

Kill -9 the broker leading the pool's events partition in the middle of a burst of
submissions: every submission admission acknowledged to its client is in the log
afterwards, the services go on with the new leader, and replays agree by digest.
"""
from __future__ import annotations

import asyncio
import secrets

import grpc
import pytest
from aiokafka.admin import AIOKafkaAdminClient

from gpusched.adapters.log.codec import decode
from gpusched.adapters.log.follower import FollowerOptions, LogFollower
from gpusched.adapters.log.publisher import DeadLetters, partition_for
from gpusched.adapters.broker.kafka_acls import grant_service_acls
from gpusched.adapters.broker.kafka_admin import TopicNames, delete_topics, ensure_topics
from gpusched.adapters.broker.kafka_security import client_args
from gpusched.client import Client, spec
from gpusched.core import events as ev
from gpusched.core.digest import digest
from gpusched.local_cluster import LocalCluster
from tests.kafka_control import start_private_cluster
from tests.integration.logcheck import read_log

pytestmark = pytest.mark.broker

PARTITIONS = 4
POOL = "default"


@pytest.fixture(scope="module")
def cluster3(request):
    yield from start_private_cluster(3, request)


@pytest.fixture
async def topics3(cluster3):
    names = TopicNames(f"t-durable-{secrets.token_hex(3)}.")
    await ensure_topics(cluster3.connection, names, PARTITIONS)   # RF and min.insync follow the 3 brokers
    await grant_service_acls(cluster3.connection, names)
    yield names
    await delete_topics(cluster3.connection, names, timeout_s=10)


async def _partition(conn, topic: str, partition: int) -> dict:
    admin = AIOKafkaAdminClient(**client_args(conn), request_timeout_ms=10_000)
    await admin.start()
    try:
        (described,) = await admin.describe_topics([topic])
        return next(p for p in described["partitions"] if p["partition"] == partition)
    finally:
        await admin.close()


async def _replay_digest(conn, topics: TopicNames, partition: int) -> tuple[str, int]:
    follower = LogFollower(conn, topics, f"replay-{secrets.token_hex(3)}", DeadLetters(None, "replay"),
                           FollowerOptions(partitions=(partition,)))
    await follower.start()
    try:
        await follower.caught_up()
        state = follower.states[partition]
        return digest(state), state.offset
    finally:
        await follower.stop()


async def test_acknowledged_submissions_survive_killing_the_partition_leader(cluster3, topics3, tmp_path):
    conn = cluster3.connection
    partition = partition_for(POOL, PARTITIONS)
    before = await _partition(conn, topics3.events, partition)
    assert len(before["replicas"]) == 3 and len(before["isr"]) == 3, before
    leader = before["leader"]

    cluster = LocalCluster(conn, topics3, tmp_path, partitions=PARTITIONS)
    acked: set[str] = set()
    refused: list[str] = []
    try:
        admission = await cluster.admission()
        await cluster.placer()
        await cluster.agent("node-0")
        client = Client(f"127.0.0.1:{admission.port}")

        async def submit(i: int) -> None:
            try:
                reply = await client.submit(spec(f"burst-{i}", "vision", gpus=1, duration=0.02), key=f"k-{i}")
                acked.add(reply.job.job_id)
            except grpc.aio.AioRpcError as exc:   # allowed: not acknowledged, so not promised
                refused.append(exc.code().name)

        async def burst(first: int, count: int) -> None:
            for start in range(first, first + count, 10):   # 10 in flight at a time
                await asyncio.gather(*(submit(i) for i in range(start, start + 10)))

        run = asyncio.create_task(burst(0, 300))
        while len(acked) < 60:                      # well into the burst
            await asyncio.sleep(0.01)
        await cluster3.kill_node_async(leader)      # SIGKILL: no controlled shutdown
        await run
        after = await _partition(conn, topics3.events, partition)
        assert after["leader"] not in (leader, -1), after

        # The services carry on with the new leader: new submissions are acknowledged and
        # every acknowledged job (before, during and after the kill) runs to its end.
        late = len(acked)
        await burst(1000, 30)
        assert len(acked) == late + 30, refused
        assert len(acked) > 250, (len(acked), refused)
        ended = await client.wait_terminal(set(acked), timeout=180)
        assert {j.job_id for j in ended} == acked
        await client.close()
    finally:
        await cluster.stop_all()

    # Every acknowledged submission is in the log, read back from the new leader.
    logged = set()
    for _, value in (await read_log(conn, topics3))[partition]:
        event, _ = decode(value)
        if isinstance(event, ev.JobSubmitted):
            logged.add(event.job_id)
    assert acked <= logged, sorted(acked - logged)[:10]

    # A replay now and a replay once the killed broker is back and in sync agree.
    first = await _replay_digest(conn, topics3, partition)
    await cluster3.start_async()
    while len((await _partition(conn, topics3.events, partition))["isr"]) < 3:
        await asyncio.sleep(0.2)
    assert await _replay_digest(conn, topics3, partition) == first


async def test_existing_topics_with_too_little_replication_are_reported_and_fixed(cluster3, caplog):
    conn = cluster3.connection
    # As older deployments left them: 3 copies but acks=all satisfied by one; one copy.
    weak, single = TopicNames(f"t-weak-{secrets.token_hex(3)}."), TopicNames(f"t-one-{secrets.token_hex(3)}.")
    await ensure_topics(conn, weak, 1, replication_factor=3, min_insync_replicas=1)
    await ensure_topics(conn, single, 1, replication_factor=1, min_insync_replicas=1)
    try:
        problems = await ensure_topics(conn, weak, 1)   # asked now: 3 copies, 2 in sync
        for topic in weak.all():
            assert f"topic {topic}: min.insync.replicas 1 < 2" in problems
            assert f"topic {topic}: min.insync.replicas raised to 2" in problems
        assert "min.insync.replicas 1 < 2" in caplog.text   # a warning at start, not only a return value
        assert not [p for p in await ensure_topics(conn, weak, 1) if "min.insync" in p]   # raised for good

        problems = await ensure_topics(conn, single, 1)
        for topic in single.all():
            assert (f"topic {topic}: replication factor 1 < 3 (needs a partition reassignment: "
                    "kafka-reassign-partitions)") in problems
            # Raising it above the one copy would refuse every acks=all write.
            assert f"topic {topic}: min.insync.replicas 1 < 2 (kept: the topic has 1 copy)" in problems
        assert not [p for p in problems if "raised" in p]
    finally:
        await delete_topics(conn, weak, timeout_s=10)
        await delete_topics(conn, single, timeout_s=10)
