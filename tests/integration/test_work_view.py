"""Node-agents on their node's work view (the default, ``--source view``;
gpusched.adapters.nodes.work_view): jobs and gangs run to the end, a cancelled one stops, a kill
-9 of the view's writer (the relay in admission) loses and doubles nothing, a node's login
reads no other node's view, ended work leaves the view as tombstones, and a cluster with
``--no-work-views`` runs agents on ``--source log`` and writes no view. The log is checked afterwards (tests/integration/logcheck.py): no worker started
twice, nothing run that the log did not place."""
from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from gpusched.adapters.broker.kafka_security import client_args
from gpusched.adapters.nodes.node_access import ensure_host_topics, ensure_node_topics
from gpusched.adapters.log.publisher import EventPublisher
from gpusched.adapters.nodes.reports import node_principal
from gpusched.adapters.nodes.work_view import OFFSET_HEADER, work_topic
from gpusched.adapters.nodes.work_writer import WorkViewWriter
from gpusched.client import Client, spec
from gpusched.core import events as ev
from gpusched.core.reducer import apply
from gpusched.core.state import ClusterState
from gpusched.local_cluster import LocalCluster
from gpusched.v1 import types_pb2
from tests.integration.logcheck import check_log, read_log
from tests.integration.cluster_calls import all_running, events_of, until
from tests.unit.core.builders import Log, make_node, whole

SUCCEEDED, CANCELLED, RUNNING = (types_pb2.JOB_PHASE_SUCCEEDED, types_pb2.JOB_PHASE_CANCELLED,
                                 types_pb2.JOB_PHASE_RUNNING)


def started_twice(log) -> list:
    starts = Counter((e.job_id, e.attempt, e.worker) for e in events_of(log) if isinstance(e, ev.WorkerStarted))
    return [k for k, n in starts.items() if n > 1]


async def test_agents_on_their_work_view_run_jobs_and_gangs_and_stop_cancelled_ones(kafka_bootstrap, topics,
                                                                                     tmp_path):
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path)
    try:
        admission = await cluster.admission("admission", 0)
        await cluster.placer()
        for node in ("n1", "n2"):
            await cluster.agent(node, "2xH100-80GB")
        client = Client(f"127.0.0.1:{admission.port}")
        short = [(await client.submit(spec(f"s{i}", "t", gpus=1, duration=0.5))).job.job_id for i in range(4)]
        gang = (await client.submit(spec("gang", "t", gpus=2, workers=2, duration=0.5))).job.job_id
        done = await client.wait_terminal(set(short) | {gang}, timeout=120)
        assert {j.phase for j in done} == {SUCCEEDED}
        assert {w.node for j in done if j.job_id == gang for w in j.workers} == {"n1", "n2"}
        long = (await client.submit(spec("long", "t", gpus=1, duration=300))).job.job_id
        await all_running(client, {long})
        await client.cancel(long)
        ended = await client.wait_terminal({long}, timeout=60)
        assert ended[0].phase == CANCELLED
        await client.close()
    finally:
        await cluster.stop_all()
    log = await read_log(kafka_bootstrap, topics)
    assert check_log(log).violations == []
    assert started_twice(log) == []
    finished = [e for e in events_of(log) if isinstance(e, ev.WorkerFinished) and e.job_id == long]
    assert finished and all(e.exit_code != 0 for e in finished)   # stopped by its agent, not run out
    # every job ended: each key of it in each view ends with a tombstone carrying its offset
    for node in ("n1", "n2"):
        latest = {r.key: r for r in await _read(kafka_bootstrap, work_topic(topics.prefix, node))}
        jobs = {key for key in latest if key.startswith(b"job:")}
        assert jobs and jobs <= {b"job:" + j.encode() for j in [*short, gang, long]}
        assert all(latest[k].value is None and dict(latest[k].headers)[OFFSET_HEADER] for k in jobs)


async def test_with_no_work_views_agents_run_on_the_log_and_no_view_is_written(kafka_bootstrap, topics, tmp_path):
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path)
    try:
        admission = await cluster.admission("admission", 0, "--no-work-views")
        await cluster.placer()
        await cluster.agent("n1", "1xH100-80GB", "--source", "log")
        client = Client(f"127.0.0.1:{admission.port}")
        job = (await client.submit(spec("j", "t", gpus=1, duration=0.2))).job.job_id
        [done] = await client.wait_terminal({job}, timeout=60)
        assert done.phase == SUCCEEDED
        await client.close()
    finally:
        await cluster.stop_all()
    assert await _read(kafka_bootstrap, work_topic(topics.prefix, "n1")) == []   # created by the agent, empty


async def test_a_killed_writer_loses_and_doubles_nothing(kafka_bootstrap, topics, tmp_path):
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path)
    try:
        admission = await cluster.admission("admission", 0)
        await cluster.placer()
        await cluster.agent("n1", "4xH100-80GB")
        client = Client(f"127.0.0.1:{admission.port}")
        first = {(await client.submit(spec(f"a{i}", "t", gpus=1, duration=4))).job.job_id for i in range(3)}
        await all_running(client, first)
        await admission.kill9()
        await client.close()
        admission = await cluster.admission("admission", 0)
        client = Client(f"127.0.0.1:{admission.port}")
        then = {(await client.submit(spec(f"b{i}", "t", gpus=1, duration=1))).job.job_id for i in range(3)}
        done = await client.wait_terminal(first | then, timeout=120)
        assert {j.phase for j in done} == {SUCCEEDED}
        assert all(j.attempt == 0 for j in done)   # none lost and placed again
        await client.close()
    finally:
        await cluster.stop_all()
    log = await read_log(kafka_bootstrap, topics)
    assert check_log(log).violations == []
    assert started_twice(log) == []


async def test_a_nodes_login_reads_only_its_own_work_view(kafka_bootstrap, topics, tmp_path):
    if not kafka_bootstrap.secured:
        pytest.skip("the broker's ACLs are what this checks: the test broker is plaintext")
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path)
    try:
        admission = await cluster.admission("admission", 0)
        await cluster.placer()
        for node in ("n1", "n2"):
            await cluster.agent(node, "1xH100-80GB")
        client = Client(f"127.0.0.1:{admission.port}")
        job = (await client.submit(spec("j", "t", gpus=1, duration=300))).job.job_id
        running = await until(client, lambda j: j.job_id == job and j.phase == RUNNING, 60)
        on = running.workers[0].node
        other = "n1" if on == "n2" else "n2"
        login = kafka_bootstrap.as_user(node_principal(other), cluster.credentials[node_principal(other)])
        assert await _read(login, work_topic(topics.prefix, other))   # its own: its node record at least
        theirs = work_topic(topics.prefix, on)
        assert any(b"job:" + job.encode() == r.key for r in await _read(kafka_bootstrap, theirs))
        assert await _read(login, theirs) == []   # the broker refuses it (the client logs it, returns nothing)
        await client.close()
    finally:
        await cluster.stop_all()


async def _read(login, topic: str):
    consumer = AIOKafkaConsumer(**client_args(login), enable_auto_commit=False, request_timeout_ms=10_000)
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        return (await consumer.getmany(tp, timeout_ms=3000)).get(tp, [])
    finally:
        await consumer.stop()


async def test_nodes_joining_at_once_share_the_writers_metadata_requests(kafka_bootstrap, topics):
    """200 nodes registering in one burst (a node host's, no work topics) cost the writer a
    few metadata requests, not one each; a node whose agent made its topic before it
    registered still gets its view, even when it registers after the others were looked up."""
    publisher = EventPublisher(kafka_bootstrap, topics, 4)
    await publisher.start()
    writer = WorkViewWriter(kafka_bootstrap, topics, publisher, "writer-test")
    state = ClusterState()
    offset = 0

    def fold(event):
        nonlocal offset
        offset += 1
        writer.on_event(0, offset, event, apply(state, event), state)

    def registered(name: str):
        return ev.NodeRegistered(event_id=f"reg-{name}", time=1.0, producer="test", node=make_node(name))

    try:
        await writer.start({})
        await ensure_node_topics(kafka_bootstrap, topics, "real-1")
        fold(registered("real-1"))
        for i in range(200):
            fold(registered(f"host0-{i:05d}"))
        await writer.idle()
        assert writer.counts["metadata"] <= 3
        await ensure_node_topics(kafka_bootstrap, topics, "real-2")   # its agent's start, then its registration
        fold(registered("real-2"))
        await writer.idle()
        assert writer.counts["metadata"] <= 4
        assert writer.counts["parked"] == 200
        for node in ("real-1", "real-2"):
            [record] = await _read(kafka_bootstrap, work_topic(topics.prefix, node))
            assert record.key == b"node"
    finally:
        await writer.stop()
        await publisher.stop()


async def test_the_writer_builds_nothing_for_the_nodes_of_a_node_host(kafka_bootstrap, topics):
    """A node host's nodes read the pool log and have no work topic: the writer (on the
    real broker) finds the host's topic and builds no record for them, neither from its
    replay nor live, for a node that registers after it went live too; an agent's node
    next to them gets its records."""
    await ensure_host_topics(kafka_bootstrap, topics, "hosta")
    await ensure_node_topics(kafka_bootstrap, topics, "agent-b")
    log = Log(make_node("hosta-00000"), make_node("agent-b"))
    log.submit("old", gpus=1)
    log.place("old", ("hosta-00000", whole(0)))
    publisher = EventPublisher(kafka_bootstrap, topics, 1)
    await publisher.start()
    writer = WorkViewWriter(kafka_bootstrap, topics, publisher, "test-writer")
    state, fed = ClusterState(), 0

    def feed() -> None:
        nonlocal fed
        for offset in range(fed, len(log.events)):
            event = log.events[offset]
            writer.on_event(0, offset, event, apply(state, event), state)
        fed = len(log.events)
    try:
        feed()                                    # the replay: noted only
        await writer.start({0: state})
        log(ev.NodeRegistered, node=make_node("hosta-00001"))
        log.submit("gang", workers=2, gpus=1)
        log.place("gang", ("hosta-00001", whole(0)), ("agent-b", whole(0)))
        feed()                                    # live
        await asyncio.wait_for(writer.idle(), 60)
        assert writer.builder.skip == {"hosta-00000", "hosta-00001"}
        assert writer.counts["parked"] == 0 and writer.counts["written"] >= 2
        assert {node for node, _ in writer.builder.written} == {"agent-b"}
    finally:
        await writer.stop()
        await publisher.stop()


class AckLostOnce(EventPublisher):
    """The real broker, but the first record sent with key ``key`` is never written and
    its acknowledgement fails only once a record sent after it is acknowledged: a send
    that timed out while the batches behind it went through."""

    def __init__(self, *args, key: bytes) -> None:
        super().__init__(*args)
        self.key = key
        self.held: asyncio.Future | None = None

    async def send_raw_later(self, topic, value, key=None, partition=None, headers=None) -> asyncio.Future:
        if key == self.key and self.held is None:
            self.held = asyncio.get_running_loop().create_future()
            return self.held
        ack = await super().send_raw_later(topic, value, key, partition, headers)
        held = self.held
        if held is not None and not held.done():
            ack.add_done_callback(lambda _: held.done() or held.set_exception(TimeoutError("no acknowledgement")))
        return ack


async def test_a_failure_mid_pipeline_leaves_the_newest_record_of_each_key_last(kafka_bootstrap, topics,
                                                                                monkeypatch):
    """A job's placement record fails after its end's tombstone, sent in a later batch,
    was written: the writer sends every batch in flight again, in order, so the view's
    last record of the job is the tombstone (not the placement, which would start it
    again), and every batch is acknowledged in the end."""
    from gpusched.adapters.nodes import work_writer
    monkeypatch.setattr(work_writer, "BATCH", 1)   # one record a batch: several batches in flight
    await ensure_node_topics(kafka_bootstrap, topics, "n1")
    publisher = AckLostOnce(kafka_bootstrap, topics, 1, key=b"job:j")
    await publisher.start()
    writer = WorkViewWriter(kafka_bootstrap, topics, publisher, "writer-test")
    log = Log(make_node("n1"))
    state, fed = ClusterState(), 0

    def feed() -> None:
        nonlocal fed
        for offset in range(fed, len(log.events)):
            writer.on_event(0, offset, log.events[offset], apply(state, log.events[offset]), state)
        fed = len(log.events)
    try:
        await writer.start({})
        feed()                                   # the node's registration
        log.submit("j", gpus=1)
        log.place("j", ("n1", whole(0)))
        log.start_all("j")
        log.finish("j", 0, 0)
        log.submit("k", gpus=1)
        log.place("k", ("n1", whole(0)))
        feed()
        await asyncio.wait_for(writer.idle(), 60)
        assert publisher.held is not None and publisher.held.done() and writer._sender.resends >= 1
        records = await _read(kafka_bootstrap, work_topic(topics.prefix, "n1"))
        last = {r.key: r for r in records}
        assert last[b"job:j"].value is None                  # the tombstone, after the placement sent again
        assert [r.value is None for r in records if r.key == b"job:j"][-2:] == [False, True]
        assert last[b"job:k"].value is not None and last[b"node"].value is not None
    finally:
        await writer.stop()
        await publisher.stop()
