"""Any replica rebuilds its state from the log: replay, kill -9 and restart."""
from __future__ import annotations

import asyncio
import uuid

import grpc
import pytest

from gpusched.adapters.log.follower import LogFollower
from gpusched.adapters.log.publisher import DeadLetters, EventPublisher
from gpusched.adapters.log.codec import decode
from gpusched.client import Client
from gpusched.core.digest import digest
from gpusched.v1 import admission_pb2, cluster_pb2, types_pb2
from gpusched.workloads import mixed_jobs
from gpusched.local_cluster import LocalCluster
from tests.integration.logcheck import check_log, read_log
from tests.integration.cluster_calls import SUCCEEDED


async def _fresh_follower(bootstrap, topics, partitions=4) -> tuple[LogFollower, EventPublisher]:
    publisher = EventPublisher(bootstrap, topics, partitions)
    await publisher.start()
    follower = LogFollower(bootstrap, topics, f"replayer-{uuid.uuid4().hex[:6]}", DeadLetters(publisher, "t"))
    await follower.start()
    await follower.caught_up()
    return follower, publisher


async def test_replicas_replaying_the_same_log_agree_and_duplicates_change_nothing(kafka_bootstrap, topics, tmp_path):
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path)
    try:
        admission = await cluster.admission()
        await cluster.placer()
        await asyncio.gather(*(cluster.agent(f"node-{i}") for i in range(2)))
        client = Client(f"127.0.0.1:{admission.port}")
        ids = {(await client.submit(s)).job.job_id for s in mixed_jobs(40, seed=3, duration=(0.1, 0.3))}
        await client.wait_terminal(ids)
        await client.close()
    finally:
        await cluster.stop_all()

    a, pa = await _fresh_follower(kafka_bootstrap, topics)
    b, pb = await _fresh_follower(kafka_bootstrap, topics)
    try:
        assert a.states.keys() == b.states.keys()
        digests = {p: digest(s) for p, s in a.states.items()}
        assert digests == {p: digest(s) for p, s in b.states.items()}
        busy = max(a.states, key=lambda p: a.states[p].applied)
        assert a.states[busy].applied > 100
        end_before = a.states[busy].offset

        # Append copies of already-applied events (a producer retry): nothing changes.
        log = await read_log(kafka_bootstrap, topics)
        for offset, value in log[busy][:50]:   # into the same partition, as a retry lands
            event, _ = decode(value)
            await pa.publish_to(event, busy)
        c, pc = await _fresh_follower(kafka_bootstrap, topics)
        try:
            assert c.states[busy].offset >= end_before + 50
            assert digest(c.states[busy]) == digests[busy]
        finally:
            await c.stop(); await pc.stop()
    finally:
        for f, p in ((a, pa), (b, pb)):
            await f.stop(); await p.stop()


async def test_kill9_placer_mid_run_new_placer_finishes_the_work(kafka_bootstrap, topics, tmp_path, monkeypatch):
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path)
    try:
        admission = await cluster.admission()
        placer = await cluster.placer("placer-1")
        await asyncio.gather(*(cluster.agent(f"node-{i}") for i in range(4)))
        client = Client(f"127.0.0.1:{admission.port}")
        specs = mixed_jobs(200, seed=11, duration=(0.2, 0.8))
        ids = {r.job.job_id for r in await asyncio.gather(*(client.submit(s) for s in specs))}

        # Kill once the run is well under way: some jobs done, most still to place.
        stream = client.jobs.WatchJobs(admission_pb2.WatchJobsRequest())
        succeeded = set()
        async for update in stream:
            if update.job.phase == SUCCEEDED:
                succeeded.add(update.job.job_id)
                if len(succeeded) >= 30:
                    break
        stream.cancel()
        await placer.kill9()
        # The new placer rebuilds every pool through a catch-up reader process, as it
        # would a pool of 100,000 records and more (the log here is a few thousand).
        monkeypatch.setenv("GPUSCHED_PARALLEL_REPLAY_MIN", "1")
        placer2 = await cluster.placer("placer-2", "--log-level", "INFO")

        jobs = await client.wait_terminal(ids)
        assert sorted(j.phase for j in jobs) == [SUCCEEDED] * len(ids)
        await client.close()
    finally:
        await cluster.stop_all()
    assert "in parallel" in placer2.log_path.read_text()
    report = check_log(await read_log(kafka_bootstrap, topics))
    assert report.violations == []
    producers = {j.job_id for j in report.jobs()}
    assert ids <= producers


async def test_kill9_admission_then_get_job_answers_from_the_rebuilt_read_model(kafka_bootstrap, topics, tmp_path):
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path)
    try:
        admission = await cluster.admission("admission-1")
        client = Client(f"127.0.0.1:{admission.port}")
        # No node registers here, so the pool must be created for jobs to be taken.
        await client.cluster.CreatePool(cluster_pb2.CreatePoolRequest(pool="default"))
        created = [(await client.submit(s, key=f"k{i}")).job for i, s in enumerate(mixed_jobs(20, seed=5))]
        cancelled = await client.jobs.CancelJob(
            admission_pb2.CancelJobRequest(job_id=created[0].job_id))
        assert cancelled.phase == types_pb2.JOB_PHASE_CANCELLED
        await client.close()
        await admission.kill9()

        admission2 = await cluster.admission("admission-2")
        client = Client(f"127.0.0.1:{admission2.port}")
        for job in created[1:]:
            again = await client.get(job.job_id)
            assert again.spec == job.spec and again.phase == types_pb2.JOB_PHASE_PENDING
        assert (await client.get(created[0].job_id)).phase == types_pb2.JOB_PHASE_CANCELLED
        # The idempotency keys survive the restart too.
        resubmit = await client.submit(mixed_jobs(20, seed=5)[3], key="k3")
        assert not resubmit.created and resubmit.job.job_id == created[3].job_id
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await client.get("job-does-not-exist")
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        await client.close()
    finally:
        await cluster.stop_all()
