"""Retention of finished jobs through the services: a finished job leaves admission's
read model once the log's clock is past its retention, its idempotency key can be used
again, live jobs stay, and its history stays in the log."""
from __future__ import annotations

import itertools

import grpc

from gpusched.adapters.log import codec
from gpusched.client import Client, spec
from gpusched.core import events as ev
from gpusched.local_cluster import LocalCluster
from gpusched.v1 import types_pb2
from tests.integration.logcheck import read_log
from tests.integration.cluster_calls import SUCCEEDED
from tests.polling import eventually_async

RETENTION_S = 2.0


async def _gone(client: Client, job_id: str, timeout: float = 60.0) -> grpc.aio.AioRpcError:
    """Submit small jobs (each moves the log's clock) until ``job_id`` is no longer found;
    the NOT_FOUND error. Retention is defined by time passing, so time must pass here."""
    ticks = itertools.count(1)

    async def not_found() -> grpc.aio.AioRpcError | None:
        await client.submit(spec(f"tick-{next(ticks)}", "ops", gpu_milli=100, duration=0.05))
        try:
            await client.get(job_id)
        except grpc.aio.AioRpcError as exc:
            assert exc.code() == grpc.StatusCode.NOT_FOUND, exc
            return exc
        return None
    return await eventually_async(not_found, f"{job_id} to leave the state", timeout, poll=0.5)


async def test_finished_jobs_leave_the_state_after_the_retention_and_free_their_key(kafka_bootstrap, topics, tmp_path):
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path, job_retention_s=RETENTION_S)
    admission = await cluster.admission()
    await cluster.placer()
    await cluster.agent("node-0", "8xA100-80GB")
    client = Client(f"127.0.0.1:{admission.port}")
    try:
        long = await client.submit(spec("long", "nlp", gpus=1, duration=600))
        first = await client.submit(spec("nightly", "nlp", gpus=1, duration=0.2), key="nightly-1")
        job_id = first.job.job_id
        [done] = await client.wait_terminal({job_id}, timeout=60)
        assert done.phase == SUCCEEDED
        again = await client.submit(spec("nightly", "nlp", gpus=1, duration=0.2), key="nightly-1")
        assert not again.created and again.job.job_id == job_id   # the key still holds

        error = await _gone(client, job_id)
        assert "kept 2s after they end" in error.details()
        # a job that is still running is never pruned, however old
        assert (await client.get(long.job.job_id)).phase == types_pb2.JOB_PHASE_RUNNING
        # the key is free again: a new job under the same (deterministic) id, which runs,
        # so the placer's and the agent's states pruned the old one too (a replica still
        # holding it would reject the new JobSubmitted as a duplicate job id)
        rerun = await client.submit(spec("nightly", "nlp", gpus=1, duration=0.2), key="nightly-1")
        assert rerun.created and rerun.job.job_id == job_id and rerun.job.attempt == 0
        [done] = await client.wait_terminal({job_id}, timeout=60)
        assert done.phase == SUCCEEDED
    finally:
        await client.close()
        await cluster.stop_all()

    # Both lives of the job are in the log, whole: pruning is a view of the state only.
    events = [codec.decode(v)[0] for records in (await read_log(kafka_bootstrap, topics)).values()
              for _, v in records]
    mine = [type(e).__name__ for e in events if getattr(e, "job_id", "") == job_id]
    assert mine.count("JobSubmitted") == 2 and mine.count("WorkerFinished") == 2
    # The retention every service folded with is the log's: admission recorded its own
    # in each partition, once, before it served.
    recorded = {p: [e.job_retention_s for e in (codec.decode(v)[0] for _, v in records)
                    if isinstance(e, ev.JobRetentionSet)]
                for p, records in (await read_log(kafka_bootstrap, topics)).items()}
    assert recorded and all(values == [RETENTION_S] for values in recorded.values()), recorded
