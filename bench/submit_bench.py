"""Benchmark: the job API through the real log, on a local cluster.

1. Throughput: N submissions over gRPC with C in flight, as fast as they go; each
   returns only once its JobSubmitted is acknowledged by the broker (acks=all) and
   folded into admission's read model.
2. Latency: open-loop arrivals at a fixed rate; submit->placed and submit->running are
   measured by the client from its SubmitJob call to the WatchJobs update showing the
   job placed / running.

    .venv/bin/python bench/submit_bench.py [--rate 200 --seconds 20 --burst 5000]
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from gpusched.adapters.kafka_admin import TopicNames
from gpusched.client import Client, spec
from gpusched.demo import ensure_broker
from gpusched.local_cluster import LocalCluster
from gpusched.v1 import admission_pb2, types_pb2

PLACED_OR_LATER = {types_pb2.JOB_PHASE_PLACED, types_pb2.JOB_PHASE_RUNNING, types_pb2.JOB_PHASE_SUCCEEDED}


def small_job(i: int) -> types_pb2.JobSpec:
    return spec(f"bench-{i}", f"team-{i % 4}", gpu_milli=100, duration=0.2, cpu_milli=100, memory_mib=256)


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


async def throughput(client: Client, count: int, concurrency: int) -> float:
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with sem:
            await client.submit(small_job(i))
    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(count)))
    return count / (time.perf_counter() - t0)


async def latency(client: Client, rate: float, seconds: float) -> tuple[list[float], list[float]]:
    sent: dict[str, float] = {}
    placed: dict[str, float] = {}
    running: dict[str, float] = {}
    stream = client.jobs.WatchJobs(admission_pb2.WatchJobsRequest(team="latency"))

    async def watch() -> None:
        async for u in stream:
            now = time.perf_counter()
            if u.job.phase in PLACED_OR_LATER:
                placed.setdefault(u.job.job_id, now)
            if u.job.phase in (types_pb2.JOB_PHASE_RUNNING, types_pb2.JOB_PHASE_SUCCEEDED):
                running.setdefault(u.job.job_id, now)

    async def submit(i: int) -> None:
        t = time.perf_counter()
        r = await client.submit(spec(f"lat-{i}", "latency", gpu_milli=100, duration=0.2, cpu_milli=100, memory_mib=256))
        sent[r.job.job_id] = t

    watcher = asyncio.create_task(watch())
    t0 = time.perf_counter()
    tasks = []
    for i in range(int(rate * seconds)):
        delay = t0 + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)   # open-loop arrival clock, not synchronisation
        tasks.append(asyncio.create_task(submit(i)))
    await asyncio.gather(*tasks)
    deadline = time.perf_counter() + 30
    while len(running) < len(sent) and time.perf_counter() < deadline:
        await asyncio.sleep(0.1)
    stream.cancel()
    watcher.cancel()
    to_placed = [1000 * (placed[j] - t) for j, t in sent.items() if j in placed]
    to_running = [1000 * (running[j] - t) for j, t in sent.items() if j in running]
    return to_placed, to_running


async def main(args: argparse.Namespace) -> None:
    bootstrap = ensure_broker()
    topics = TopicNames(f"bench-{int(time.time())}.")
    cluster = LocalCluster(bootstrap, topics, Path(tempfile.mkdtemp(prefix="gpusched-bench-")))
    try:
        admission = await cluster.admission()
        await cluster.placer()
        await asyncio.gather(*(cluster.agent(f"node-{i}") for i in range(args.nodes)))
        client = Client(f"127.0.0.1:{admission.port}")
        await throughput(client, 300, 64)   # warm up connections and code paths
        rate = await throughput(client, args.burst, args.concurrency)
        print(f"throughput: {args.burst} submissions, {args.concurrency} in flight: {rate:,.0f} submissions/s")
        to_placed, to_running = await latency(client, args.rate, args.seconds)
        n = int(args.rate * args.seconds)
        print(f"latency at {args.rate:.0f} jobs/s for {args.seconds:.0f}s ({n} jobs, {len(to_running)} ran):")
        print(f"  submit->placed  p50 {pct(to_placed, .5):6.1f} ms  p99 {pct(to_placed, .99):6.1f} ms  mean {statistics.fmean(to_placed):6.1f} ms")
        print(f"  submit->running p50 {pct(to_running, .5):6.1f} ms  p99 {pct(to_running, .99):6.1f} ms  mean {statistics.fmean(to_running):6.1f} ms")
        await client.close()
    finally:
        await cluster.stop_all()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--burst", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--rate", type=float, default=200)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--nodes", type=int, default=2)
    asyncio.run(main(parser.parse_args()))
