"""Benchmark: the job API through the real log, on a local cluster.

1. Throughput: ``--rounds`` bursts of N submissions over gRPC with C in flight, as fast
   as they go; each returns only once its JobSubmitted is acknowledged by the broker
   (acks=all) and folded into admission's read model. The cluster places and runs the
   jobs meanwhile (it is part of what the machine does per job). Between rounds the
   benchmark waits until every job of the round has ended, so each round starts on an
   idle cluster. Per round: submissions/s and the CPU each process used per job
   (admission, placer, node-agents, the broker and this client, from /proc). With
   ``--batch N`` the same jobs go in SubmitJobs calls of N (as a platform flushing its
   queue, or a sweep, would), C/N calls in flight.
2. Latency: on the drained cluster, open-loop arrivals at a fixed rate; submit->placed
   and submit->running are measured by the client from its SubmitJob call to the
   WatchJobs update showing the job placed / running.

    .venv/bin/python bench/submit_bench.py [--rounds 3 --burst 5000 --rate 200 --seconds 20]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path

# Bursts of thousands of one team's jobs are the point here: admission's per-team rate
# and pending limits (docs/reference/api-errors.md) are turned off for the services it starts.
os.environ.setdefault("GPUSCHED_SUBMIT_RATE", "0")
os.environ.setdefault("GPUSCHED_MAX_PENDING_PER_TEAM", "0")

from gpusched.adapters.log.publisher import EventPublisher
from gpusched.adapters.broker.kafka_admin import TopicNames, delete_topics
from gpusched.client import Client, spec
from gpusched.core import events as ev
from gpusched.core.model import GpuInfo, NodeInfo
from gpusched.demo import ensure_broker
from gpusched.local_cluster import LocalCluster
from gpusched.v1 import admission_pb2, types_pb2

PLACED_OR_LATER = {types_pb2.JOB_PHASE_PLACED, types_pb2.JOB_PHASE_RUNNING, types_pb2.JOB_PHASE_SUCCEEDED}


def small_job(i: int) -> types_pb2.JobSpec:
    return spec(f"bench-{i}", f"team-{i % 4}", gpu_milli=100, duration=0.2, cpu_milli=100, memory_mib=256)


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


async def throughput(client: Client, count: int, concurrency: int, offset: int = 0,
                     batch: int = 0) -> tuple[float, set[str]]:
    """Submissions/s of ``count`` submissions with ``concurrency`` jobs in flight, and their
    job ids: one SubmitJob call per job, or (``batch``) SubmitJobs calls of that many."""
    size = batch or 1
    sem = asyncio.Semaphore(max(2, concurrency // size))
    ids: set[str] = set()

    async def call(first: int) -> None:
        async with sem:
            specs = [small_job(offset + i) for i in range(first, min(count, first + size))]
            if batch:
                ids.update(r.job.job_id for r in await client.submit_many([(s, "") for s in specs]))
            else:
                ids.add((await client.submit(specs[0])).job.job_id)
    t0 = time.perf_counter()
    await asyncio.gather(*(call(i) for i in range(0, count, size)))
    return count / (time.perf_counter() - t0), ids


async def drained(client: Client) -> None:
    """Until the pool has no pending or running job. A cheap poll of the pool summary:
    following every job through WatchJobs would add its own CPU to what is measured."""
    while True:
        summary = await client.summary()
        if summary.pending_jobs == 0 and summary.running_jobs == 0:
            return
        await asyncio.sleep(0.1)   # poll period


_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far (/proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def broker_pid() -> int | None:
    """The broker deploy/kafka.sh started for this checkout, if it is the one we use."""
    try:
        return int((Path(__file__).resolve().parents[1] / ".run/kafka/kafka.pid").read_text())
    except (OSError, ValueError):
        return None


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


async def register_cordoned(bootstrap: str, topics: TopicNames, partitions: int, count: int) -> None:
    """``count`` more 8-GPU nodes in the pool, registered and cordoned at once, with no
    agent: the pool every submission is validated against grows, its capacity does not."""
    publisher = EventPublisher(bootstrap, topics, partitions)
    await publisher.start()
    try:
        events = []
        for i in range(count):
            name = f"idle-{i:05d}"
            gpus = tuple(GpuInfo(g, f"{name}-g{g}", "H100-80GB", 81_559, True) for g in range(8))
            info = NodeInfo(name=name, pool="default", cpu_milli=128_000, memory_mib=1_048_576, gpus=gpus,
                            simulated=True)
            events += [(ev.NodeRegistered(event_id=uuid.uuid4().hex, time=time.time(), producer="bench", node=info),
                        "default"),
                       (ev.NodeCordoned(event_id=uuid.uuid4().hex, time=time.time(), producer="bench", node=name,
                                        reason="bench: validation only"), "default")]
        await publisher.publish_all(events)
    finally:
        await publisher.stop()


async def main(args: argparse.Namespace) -> None:
    bootstrap = ensure_broker()
    topics = TopicNames(f"bench-{int(time.time())}.")
    cluster = LocalCluster(bootstrap, topics, Path(tempfile.mkdtemp(prefix="gpusched-bench-")))
    try:
        admission = await cluster.admission()
        await cluster.placer()
        await asyncio.gather(*(cluster.agent(f"node-{i}") for i in range(args.nodes)))
        if args.cordoned_nodes:
            await register_cordoned(bootstrap, topics, cluster.partitions, args.cordoned_nodes)
        client = Client(f"127.0.0.1:{admission.port}")
        await throughput(client, 300, 64, offset=10**8)   # warm up connections and code paths
        await drained(client)
        procs = {s.name: s.proc.pid for s in cluster.services}
        if (pid := broker_pid()) is not None:
            procs["broker"] = pid
        procs["client"] = os.getpid()
        calls = f"SubmitJobs calls of {args.batch}" if args.batch else "one SubmitJob call each"
        print(f"throughput: {args.rounds} rounds of {args.burst} submissions ({calls}), {args.concurrency} in flight, "
              f"{args.nodes} simulated 8-GPU nodes (CPU per job over each round: submit until the last job ended)")
        rates = []
        for r in range(args.rounds):
            before = {name: cpu_seconds(pid) for name, pid in procs.items()}
            t0 = time.perf_counter()
            rate, _ = await throughput(client, args.burst, args.concurrency, offset=r * args.burst, batch=args.batch)
            await drained(client)   # the round's jobs all ran: the next round starts idle
            ended = time.perf_counter() - t0
            used = {name: cpu_seconds(pid) - before[name] for name, pid in procs.items()}
            rates.append(rate)
            per_job = "  ".join(f"{name} {1000 * c / args.burst:.2f}" for name, c in used.items())
            print(f"  round {r + 1}: {rate:,.0f} submissions/s (all ended after {ended:.1f}s); "
                  f"CPU ms/job: {per_job}; total {1000 * sum(used.values()) / args.burst:.2f}")
        if rates:   # --rounds 0: the latency test alone
            print(f"throughput: median {statistics.median(rates):,.0f} submissions/s "
                  f"(min {min(rates):,.0f}, max {max(rates):,.0f})")
        to_placed, to_running = await latency(client, args.rate, args.seconds)
        n = int(args.rate * args.seconds)
        print(f"latency at {args.rate:.0f} jobs/s for {args.seconds:.0f}s ({n} jobs, {len(to_running)} ran):")
        print(f"  submit->placed  p50 {pct(to_placed, .5):6.1f} ms  p99 {pct(to_placed, .99):6.1f} ms  mean {statistics.fmean(to_placed):6.1f} ms")
        print(f"  submit->running p50 {pct(to_running, .5):6.1f} ms  p99 {pct(to_running, .99):6.1f} ms  mean {statistics.fmean(to_running):6.1f} ms")
        await client.close()
    finally:
        await cluster.stop_all()
        if problem := await delete_topics(bootstrap, topics):   # runs must not pile up on a dev broker
            print(f"could not delete topics {topics.prefix}*: {problem}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--burst", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=256, help="jobs in flight")
    parser.add_argument("--batch", type=int, default=0,
                        help="submit in SubmitJobs calls of this many jobs (0: one SubmitJob call per job)")
    parser.add_argument("--rate", type=float, default=200)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--cordoned-nodes", type=int, default=0,
                        help="also register this many cordoned nodes with no agent (a large pool to validate against)")
    asyncio.run(main(parser.parse_args()))
