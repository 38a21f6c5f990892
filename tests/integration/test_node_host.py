"""A node host (``gpusched node-host``: many simulated nodes in one process) next to real
node-agents in one pool: jobs and a gang spanning hosted and real nodes run to the end,
a host killed with kill -9 has each of its nodes declared lost and their work placed
again, and the chaos run's invariants hold with most nodes hosted. The log is checked afterwards (tests/integration/logcheck.py): nothing run that
the log did not place, no worker started twice, no GPU over-allocated."""
from __future__ import annotations

import asyncio
import random
from collections import Counter

from aiokafka import AIOKafkaProducer

from gpusched.adapters.log import codec
from gpusched.adapters.broker.kafka_security import client_args
from gpusched.adapters.nodes.reports import NODE_HEADER, host_report_topic
from gpusched.client import Client, spec
from gpusched.core import events as ev
from gpusched.local_cluster import LocalCluster
from gpusched.v1 import types_pb2
from gpusched.workloads import mixed_jobs
from tests.integration.logcheck import check_log, read_log
from gpusched.ports import free_port
from tests.integration.cluster_calls import all_running, events_of, submit_with_retries
from tests.polling import eventually_async

SUCCEEDED = types_pb2.JOB_PHASE_SUCCEEDED
HOSTED = 50
FAST = ("--heartbeat-interval", "0.5")
CHAOS_JOBS = 600


def started_twice(events) -> list:
    starts = Counter((e.job_id, e.attempt, e.worker) for e in events if isinstance(e, ev.WorkerStarted))
    return [k for k, n in starts.items() if n > 1]


async def test_hosted_and_real_nodes_run_jobs_and_a_gang_across_both(kafka_bootstrap, topics, tmp_path):
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path)
    try:
        admission = await cluster.admission()
        await cluster.placer()
        await cluster.preemptor("preemptor", "--heartbeat-timeout", "3")
        # One GPU a node: a gang of one worker per node must span every node, hosted and real.
        await asyncio.gather(cluster.node_host("h1", HOSTED, "1xH100-80GB", *FAST),
                             *(cluster.agent(n, "1xH100-80GB", *FAST) for n in ("r1", "r2")))
        client = Client(f"127.0.0.1:{admission.port}")
        assert len([n for n in await client.nodes() if n.info.name.startswith("h1-")]) == HOSTED
        singles = {(await client.submit(spec(f"s{i}", "t", gpus=1, duration=0.3))).job.job_id for i in range(80)}
        done = await client.wait_terminal(singles, timeout=180)
        assert {j.phase for j in done} == {SUCCEEDED}
        gang = (await client.submit(spec("gang", "t", gpus=1, workers=HOSTED + 2, duration=0.5))).job.job_id
        [gang_done] = await client.wait_terminal({gang}, timeout=180)
        assert gang_done.phase == SUCCEEDED
        assert {w.node for w in gang_done.workers} == {f"h1-{i:05d}" for i in range(HOSTED)} | {"r1", "r2"}
        await client.close()
    finally:
        await cluster.stop_all()
    log = await read_log(kafka_bootstrap, topics)
    assert check_log(log).violations == []
    events = events_of(log)
    assert started_twice(events) == []
    ran_on = {e.node for e in events if isinstance(e, ev.WorkerStarted)}
    assert len([n for n in ran_on if n.startswith("h1-")]) == HOSTED and {"r1", "r2"} <= ran_on
    # every worker placed was reported started and finished by its own node, once
    finished = Counter((e.job_id, e.attempt, e.worker, e.node) for e in events if isinstance(e, ev.WorkerFinished))
    assert set(finished.values()) == {1} and len(finished) == 80 + HOSTED + 2


async def test_a_killed_host_has_each_node_declared_lost_and_its_work_placed_again(kafka_bootstrap, topics,
                                                                                  tmp_path):
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path)
    try:
        admission = await cluster.admission()
        await cluster.placer()
        await cluster.preemptor("preemptor", "--heartbeat-timeout", "3")
        doomed = await cluster.node_host("h1", 10, "2xH100-80GB", *FAST)
        await cluster.agent("r1", "2xH100-80GB", *FAST)
        client = Client(f"127.0.0.1:{admission.port}")
        # 22 GPUs, 11 two-GPU jobs: every node busy, ten of them hosted
        ids = {(await client.submit(spec(f"j{i}", "t", gpus=2, duration=8.0))).job.job_id for i in range(11)}
        await all_running(client, ids)
        on_host = {j.job_id for j in await client.list_all() if j.job_id in ids and j.workers[0].node.startswith("h1-")}
        assert len(on_host) == 10
        await doomed.kill9()
        # Room for the work placed again: a second host, whose nodes the first's loss must not touch.
        await cluster.node_host("h2", 10, "2xH100-80GB", *FAST)
        done = await client.wait_terminal(ids, timeout=180)
        assert {j.phase for j in done} == {SUCCEEDED}
        moved = {j.job_id for j in done if j.attempt >= 1}
        assert moved == on_host
        # Placed again on the second host, or on r1 once its own job ended: never on a
        # lost node, whatever the placement policy or how soon r1 freed.
        placed_again = [j.workers[0].node for j in done if j.job_id in moved]
        assert all(n.startswith("h2-") or n == "r1" for n in placed_again), placed_again
        nodes = {n.info.name: n.status for n in await client.nodes()}
        assert {s for n, s in nodes.items() if n.startswith("h1-")} == {types_pb2.NODE_STATUS_LOST}
        assert nodes["r1"] == types_pb2.NODE_STATUS_READY
        assert {s for n, s in nodes.items() if n.startswith("h2-")} == {types_pb2.NODE_STATUS_READY}
        await client.close()
    finally:
        await cluster.stop_all()
    log = await read_log(kafka_bootstrap, topics)
    assert check_log(log).violations == []
    events = events_of(log)
    lost = Counter(e.node for e in events if isinstance(e, ev.NodeLost))
    assert lost == Counter({f"h1-{i:05d}": 1 for i in range(10)})   # each hosted node, once; no other
    assert started_twice(events) == []


async def test_a_host_cannot_report_for_a_node_it_does_not_host(kafka_bootstrap, topics, tmp_path):
    """The relay takes a host's record as its named node's report only for nodes named
    ``<host>-...``: one naming a real node is dead-lettered, not appended."""
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path)
    try:
        await cluster.admission()
        await cluster.node_host("h1", 2, "1xH100-80GB")
        await cluster.agent("r1", "1xH100-80GB")
        forged = ev.GpuHealthChanged(event_id="forged-1", time=1.0, producer="x", node="r1", gpu_index=0,
                                     healthy=False, reason="forged")
        honest = ev.GpuHealthChanged(event_id="honest-1", time=1.0, producer="x", node="h1-00001", gpu_index=0,
                                     healthy=False, reason="real fault")
        producer = AIOKafkaProducer(**client_args(kafka_bootstrap))
        await producer.start()
        topic = host_report_topic(topics.prefix, "h1")
        for event, node in ((forged, "r1"), (honest, "h1-00001")):
            await producer.send_and_wait(topic, codec.encode(event, "default"), key=b"default",
                                         headers=[(NODE_HEADER, node.encode())])
        await producer.stop()

        async def relayed():   # polling the log: the relay has no event to await
            ids = {e.event_id for e in events_of(await read_log(kafka_bootstrap, topics))}
            return "honest-1" in ids and ids
        ids = await eventually_async(relayed, "the honest report relayed", 60, poll=0.2)
        assert "forged-1" not in ids
        letters = await read_log(kafka_bootstrap, topics, topics.dead_letters)
        assert any(b"does not host" in v for records in letters.values() for _, v in records)
    finally:
        await cluster.stop_all()


async def test_chaos_with_hosted_nodes_loses_nothing_and_runs_nothing_twice(kafka_bootstrap, topics, tmp_path,
                                                                           kafka_control):
    """The chaos run's invariants (tests/integration/test_chaos.py) with most nodes hosted:
    admission, placer, preemptor, the node host and a real agent killed with kill -9 at
    random moments, twice each, the broker restarted once; every job ends, none is lost,
    no attempt is placed twice, no GPU is over-allocated."""
    rng = random.Random(2027)
    port = free_port()
    args = ("--heartbeat-interval", "0.5", "--grace", "2")
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path)

    async def restart(name: str) -> None:
        if name == "admission":
            await cluster.admission("admission", port)
        elif name == "placer":
            await cluster.placer("placer")
        elif name == "preemptor":
            await cluster.preemptor("preemptor", "--heartbeat-timeout", "3", "--min-runtime", "1", "--max-loss-per-wait", "inf")
        elif name == "host-h1":
            await cluster.node_host("h1", 12, "8xH100-80GB", *args)
        else:
            await cluster.agent("r1", "8xH100-80GB", *args)
    try:
        for name in ("admission", "placer", "preemptor", "host-h1", "agent-r1"):
            await restart(name)
        specs = mixed_jobs(CHAOS_JOBS, seed=41, duration=(0.05, 0.4))
        keys = [f"hosted-chaos-{i}" for i in range(CHAOS_JOBS)]
        submitting = asyncio.create_task(submit_with_retries(f"127.0.0.1:{port}", specs, keys))
        schedule = [v for v in ("admission", "placer", "preemptor", "host-h1", "agent-r1") for _ in range(2)]
        rng.shuffle(schedule)
        for i, name in enumerate(schedule):
            await asyncio.sleep(rng.uniform(1.0, 3.0))   # chaos clock: random moments
            if i == len(schedule) // 2:
                await kafka_control.restart_async(hard=False)
            await next(s for s in reversed(cluster.services) if s.name == name).kill9()
            if name in ("host-h1", "agent-r1") and rng.random() < 0.5:
                await asyncio.sleep(4.0)                  # dead past the heartbeat timeout: its nodes are lost
            await restart(name)
        ids = await submitting
        assert len(set(ids.values())) == CHAOS_JOBS
        client = Client(f"127.0.0.1:{port}")
        jobs = await client.wait_terminal(set(ids.values()), timeout=600)
        assert {types_pb2.JobPhase.Name(j.phase) for j in jobs} <= {"JOB_PHASE_SUCCEEDED", "JOB_PHASE_FAILED"}
        await client.close()
    finally:
        await cluster.stop_all()
    log = await read_log(kafka_bootstrap, topics)
    report = check_log(log)
    assert report.violations == []
    in_log = {j.job_id: j for j in report.jobs()}
    assert len(in_log) == CHAOS_JOBS and all(in_log[j].phase.terminal for j in ids.values())
    assert any(e.node.startswith("h1-") for e in events_of(log) if isinstance(e, ev.WorkerStarted))
