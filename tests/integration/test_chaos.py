"""Chaos: 2,000 jobs while admission, placer, preemptor and node-agents are killed with
kill -9 at random moments, several times each, and the broker restarts once. Afterwards
the log must show every job ended (or running), none lost, none run twice at once, and
no GPU ever over-allocated."""
from __future__ import annotations

import asyncio
import random
import socket

import grpc

from gpusched.client import Client
from gpusched.local_cluster import LocalCluster
from gpusched.v1 import admission_pb2, types_pb2
from gpusched.workloads import mixed_jobs
from tests.integration.logcheck import check_log, read_log

JOBS = 2000
AGENT_ARGS = ("--heartbeat-interval", "0.5", "--grace", "2")
RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.INTERNAL,
             grpc.StatusCode.UNKNOWN, grpc.StatusCode.CANCELLED}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


async def chaos(cluster: LocalCluster, kafka_control, rng: random.Random, admission_port: int, rounds: int) -> list[str]:
    victims = ["admission", "placer", "preemptor", "agent-node-0", "agent-node-1", "agent-node-2", "agent-node-3"]
    schedule = [v for v in victims for _ in range(2)] + rng.sample(victims, rounds - 2 * len(victims))
    rng.shuffle(schedule)
    broker_at = len(schedule) // 2
    done = []
    for i, name in enumerate(schedule):
        await asyncio.sleep(rng.uniform(1.0, 3.0))   # chaos clock: random moments
        if i == broker_at:
            await kafka_control.restart_async(hard=False)
            done.append("broker")
        service = next(s for s in reversed(cluster.services) if s.name == name)
        await service.kill9()
        if name.startswith("agent-") and rng.random() < 0.5:
            await asyncio.sleep(4.0)                  # stay dead past the heartbeat timeout
        await restart(cluster, name, admission_port)
        done.append(name)
    return done


async def restart(cluster: LocalCluster, name: str, admission_port: int) -> None:
    if name == "admission":
        await cluster.admission("admission", admission_port)
    elif name == "placer":
        await cluster.placer("placer")
    elif name == "preemptor":
        await cluster.preemptor("preemptor", "--heartbeat-timeout", "3", "--min-runtime", "1")
    else:
        await cluster.agent(name.removeprefix("agent-"), "8xH100-80GB", *AGENT_ARGS)


async def test_chaos_run_loses_nothing_runs_nothing_twice_never_overallocates(kafka_bootstrap, topics, tmp_path, kafka_control):
    rng = random.Random(2026)
    port = free_port()
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path)
    try:
        await cluster.admission("admission", port)
        await cluster.placer("placer")
        await cluster.preemptor("preemptor", "--heartbeat-timeout", "3", "--min-runtime", "1")
        await asyncio.gather(*(cluster.agent(f"node-{i}", "8xH100-80GB", *AGENT_ARGS) for i in range(4)))
        specs = mixed_jobs(JOBS, seed=99, duration=(0.05, 0.4))
        for i, s in enumerate(specs):
            if i % 5 == 0:
                s.checkpoint_interval_s = 0.1
        keys = [f"chaos-{i}" for i in range(JOBS)]
        submitting = asyncio.create_task(submit_with_retries(f"127.0.0.1:{port}", specs, keys))
        killed = await chaos(cluster, kafka_control, rng, port, rounds=16)
        ids = await submitting
        assert "broker" in killed and len(killed) == 17
        assert len(set(ids.values())) == JOBS        # one job per key, none lost

        client = Client(f"127.0.0.1:{port}")
        jobs = await client.wait_terminal(set(ids.values()), timeout=600)
        assert len(jobs) == JOBS
        phases = {types_pb2.JobPhase.Name(j.phase) for j in jobs}
        assert phases <= {"JOB_PHASE_SUCCEEDED", "JOB_PHASE_FAILED"}, phases
        await client.close()
    finally:
        await cluster.stop_all()

    report = check_log(await read_log(kafka_bootstrap, topics))
    assert report.violations == []
    in_log = {j.job_id: j for j in report.jobs()}
    assert set(ids.values()) <= in_log.keys()
    assert all(in_log[j].phase.terminal for j in ids.values())
    assert len(in_log) == JOBS                      # no job the clients did not ask for
