"""The Python client against a real admission process: retries on UNAVAILABLE keep one
job per idempotency key across an admission killed with SIGKILL, and the blocking
client (connect) makes the same calls."""
from __future__ import annotations

import asyncio

import grpc
import pytest

from gpusched.client import NO_RETRY, Client, Retry, connect, spec
from gpusched.local_cluster import LocalCluster
from gpusched.v1 import types_pb2


@pytest.fixture
async def cluster(kafka_bootstrap, topics, tmp_path):
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path)
    admission = await cluster.admission()
    await cluster.agent("node-0", "8xH100-80GB")   # the pool; no placer: jobs stay pending
    yield cluster, admission
    await cluster.stop_all()


async def _down_then_up(cluster: LocalCluster, admission, calls) -> list:
    """SIGKILL admission, start ``calls`` while it is down, restart it on its port."""
    port = admission.port
    await admission.kill9()
    client = Client(f"127.0.0.1:{port}", retry=Retry(budget_s=120.0))
    try:
        started = [asyncio.create_task(call(client)) for call in calls]
        # they are failing and retrying now: nothing listens on the port
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await Client(f"127.0.0.1:{port}", retry=NO_RETRY).get("job-x")
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert not any(t.done() for t in started)
        await cluster.admission("admission-restarted", port)
        return await asyncio.gather(*started)
    finally:
        await client.close()


async def test_retries_across_an_admission_kill_keep_one_job_per_key(cluster):
    c, admission = cluster
    target = f"127.0.0.1:{admission.port}"
    first = await Client(target).submit(spec("keyed", "nlp", gpus=1), key="run-7")
    assert first.created

    job_spec = spec("unkeyed", "nlp", gpus=1)
    again, *unkeyed = await _down_then_up(c, admission, [
        lambda cl: cl.submit(spec("keyed", "nlp", gpus=1), key="run-7"),
        # no key given: the client makes one and keeps it across its retries
        lambda cl: cl.submit(job_spec)])
    assert not again.created and again.job.job_id == first.job.job_id
    assert unkeyed[0].created

    jobs = await Client(target).list_all(team="nlp")
    names = sorted(j.spec.name for j in jobs)
    assert names == ["keyed", "unkeyed"], names


async def test_submissions_in_flight_when_admission_is_killed_make_one_job_each(cluster):
    """Calls cut off mid-way (some after admission wrote the job, before it answered) are
    retried with their keys: as many jobs as submissions, each answered with its own."""
    c, admission = cluster
    port = admission.port
    client = Client(f"127.0.0.1:{port}", retry=Retry(budget_s=120.0))
    answered = asyncio.Event()
    count = 0

    async def one(i: int):
        nonlocal count
        response = await client.submit(spec(f"burst-{i}", "ml", gpu_milli=100))   # a key of its own, made
        count += 1
        if count == 10:
            answered.set()
        return response
    calls = [asyncio.create_task(one(i)) for i in range(60)]
    await answered.wait()
    await admission.kill9()
    await c.admission("admission-restarted", port)
    responses = await asyncio.gather(*calls)
    await client.close()
    listed = await Client(f"127.0.0.1:{port}").list_all(team="ml")
    assert sorted(j.spec.name for j in listed) == sorted(f"burst-{i}" for i in range(60))
    assert {r.job.job_id for r in responses} == {j.job_id for j in listed}


async def test_the_blocking_client_submits_lists_watches_and_cancels(cluster):
    _, admission = cluster
    target = f"127.0.0.1:{admission.port}"

    def session() -> tuple:
        with connect(target) as client:
            job = client.submit(spec("sync", "cv", gpus=2)).job
            listed = [j.job_id for j in client.list_all(team="cv")]
            first = next(iter(client.watch(job_id=job.job_id)))
            cancelled = client.cancel(job.job_id, "done with it")
            nodes = [n.info.name for n in client.nodes()]
            return job, listed, first, cancelled, nodes
    # SyncClient runs its own event loop, so it is used from a thread without one
    job, listed, first, cancelled, nodes = await asyncio.to_thread(session)
    assert listed == [job.job_id] and first.job.job_id == job.job_id
    assert first.job.phase == types_pb2.JOB_PHASE_PENDING
    assert cancelled.phase == types_pb2.JOB_PHASE_CANCELLED and nodes == ["node-0"]
