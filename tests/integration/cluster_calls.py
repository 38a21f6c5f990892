"""What the integration tests ask of a running local cluster: the job phases they wait for,
the first job update that satisfies a predicate (``until``, ``all_running``), a node's status
in the pool log (``until_node``), the events of a log read back (``events_of``), and
submission retried through admission restarts (``submit_with_retries``)."""
from __future__ import annotations

import asyncio

from gpusched.adapters.log import codec
from gpusched.adapters.log.follower import LogFollower
from gpusched.adapters.log.publisher import DeadLetters
from gpusched.core.model import NodeStatus
from gpusched.client import Client
from gpusched.core import events as ev
from gpusched.v1 import admission_pb2, types_pb2
import grpc


RUNNING = types_pb2.JOB_PHASE_RUNNING


async def until(client: Client, predicate, timeout: float = 120.0, **filters) -> types_pb2.Job:
    """First WatchJobs update (current state included) for which ``predicate(job)`` holds."""
    stream = client.jobs.WatchJobs(admission_pb2.WatchJobsRequest(**filters))

    async def follow():
        async for update in stream:
            if predicate(update.job):
                return update.job
    try:
        return await asyncio.wait_for(follow(), timeout)
    finally:
        stream.cancel()


async def all_running(client: Client, ids: set[str], timeout: float = 120.0) -> None:
    running: set[str] = set()

    def seen(job) -> bool:
        if job.job_id in ids and job.phase == RUNNING:
            running.add(job.job_id)
        return running == ids
    await until(client, seen, timeout)


def events_of(log) -> list[ev.Event]:
    return [codec.decode(v)[0] for records in log.values() for _, v in records if v]


async def until_node(bootstrap, topics, name: str, status: NodeStatus, timeout: float = 30.0):
    """Follow the pool log itself until the node reaches ``status``."""
    follower = LogFollower(bootstrap, topics, "test-watch", DeadLetters(None, "test"))
    await follower.start()
    try:
        async def reached():
            while True:
                for state in follower.states.values():
                    node = state.nodes.get(name)
                    if node is not None and node.status is status:
                        return node
                follower.changed.clear()
                await follower.changed.wait()
        return await asyncio.wait_for(reached(), timeout)
    finally:
        await follower.stop()


SUCCEEDED = types_pb2.JOB_PHASE_SUCCEEDED


RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.INTERNAL,
             grpc.StatusCode.UNKNOWN, grpc.StatusCode.CANCELLED}


async def submit_with_retries(target: str, specs, keys) -> dict[str, str]:
    """Submit every job with its idempotency key, retrying through admission restarts."""
    client = Client(target)
    ids: dict[str, str] = {}
    sem = asyncio.Semaphore(32)

    async def one(spec, key):
        async with sem:
            while True:
                try:
                    request = admission_pb2.SubmitJobRequest(spec=spec, idempotency_key=key)
                    ids[key] = (await client.jobs.SubmitJob(request, timeout=10)).job.job_id
                    return
                except grpc.aio.AioRpcError as err:
                    assert err.code() in RETRYABLE, err
                    await asyncio.sleep(0.2)   # back-off while admission restarts
    await asyncio.gather(*(one(s, k) for s, k in zip(specs, keys)))
    await client.close()
    return ids
