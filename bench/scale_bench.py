"""Benchmark: the whole cluster at scale on one machine, through the real broker.

Every service (admission with its relay, one placer, the preemptor) and the broker run
here, with ``--nodes`` simulated 8-GPU nodes run by ``--hosts`` node hosts
(``gpusched node-host``). A backlog of ``--backlog`` jobs goes in through SubmitJobs
batches: the openb trace's GPU tasks (``gpusched.sim.traces``: GPU shares and whole GPUs;
its CPU-only tasks and GPU-model restrictions left out, every node is an H100), plus gangs of 2-8
whole nodes (``--gangs``, a fraction) and MIG slices (``--mig``, a fraction). Runs last
``--duration`` seconds, longer than the run: what is placed stays, so the figure is
placements into an emptying cluster, as kube-scheduler's scheduler_perf measures.

Reported, from the pool log itself and the processes:
- placements/s from submit to running: jobs running (every worker's WorkerStarted in the
  log) over the time from the first submission to the last start, and over the middle
  80 % of the starts (sustained);
- the placer's cycles in the burst from its ``--cycle-log`` (each cycle's exact wall time,
  its CPU and GC time, jobs pending and placed; ``gpusched_placer.cycle_log``): count, mean,
  p50, p99, max, the first (cold) cycle apart from the rest's p99, the wall time spent
  waiting for a core (wall less CPU), the time between cycles (the append and its round
  trip through the log), and the longest few; the load average beside them;
- heartbeat load on the broker: the host beats topics' records/s and bytes/s over 10 s;
- RSS of each service process and of the broker, which the bench starts for itself on
  free ports (``deploy/kafka.sh``, data in ``.run/scale-kafka-PORT``, wiped at the end;
  a broker in ``KAFKA_BOOTSTRAP_SERVERS`` is used instead, and not counted);
- with ``--sim-nice N``, the node hosts and the bench's submitter (which stand for other
  machines: the nodes' agents and the clients) run at nice N through the burst, so the
  scheduler's services and the broker have the cores first (other work on the machine at
  nice 0 gains as much); 0 (the default) leaves every process at the same priority. The
  hosts then report starts later: submit->placed (each running job's ``JobPlaced``) is
  given beside submit->running;
- placer takeover: kill -9 the placer, start another, seconds until it is ready, until its
  first cycle ended, and until a job submitted then is placed (where there is room).

    .venv/bin/python bench/scale_bench.py --nodes 1000 --backlog 5000 [--hosts 1]
    .venv/bin/python bench/scale_bench.py --nodes 5000 --backlog 50000 --hosts 4
"""
from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import shlex
import sys
from collections import Counter
import tempfile
import time
from pathlib import Path

os.environ.setdefault("GPUSCHED_SUBMIT_RATE", "0")            # a backlog of one team's jobs is the point
os.environ.setdefault("GPUSCHED_MAX_PENDING_PER_TEAM", "0")

import urllib.request   # noqa: E402  (scraping the placer's /metrics)
from aiokafka import AIOKafkaConsumer, TopicPartition   # noqa: E402

from gpusched.adapters.log import codec   # noqa: E402
from gpusched.adapters.broker.kafka_admin import TopicNames, delete_topics   # noqa: E402
from gpusched.adapters.broker.kafka_security import client_args   # noqa: E402
from gpusched.adapters.nodes.reports import host_beats_topic   # noqa: E402
from gpusched.client import Client, spec   # noqa: E402
from gpusched.core import events as ev   # noqa: E402
from gpusched.local_cluster import LocalCluster   # noqa: E402
from gpusched.sim import traces   # noqa: E402
from gpusched.v1 import types_pb2   # noqa: E402
from gpusched_placer import cycle_log   # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scale_processes import (Broker, cpu_seconds, restore_priority, rss_mib, service_pids,  # noqa: E402
                             sim_priority, start_profiles, stop_profiles)

HOUR = 3600.0
BATCH = 500
MIG_PROFILE = "1g.10gb"
CYCLE = "gpusched_placer_cycle_duration_seconds"


def openb_specs(count: int, gangs: float, mig: float, duration: float, seed: int = 7) -> list[types_pb2.JobSpec]:
    """The backlog: openb tasks drawn with replacement, gangs of 2-8 whole nodes, MIG slices."""
    rng = random.Random(seed)
    # the API takes GPU jobs only: the trace's CPU-only tasks are left out
    tasks = [t for t in traces.load_tasks("default") if t.resources.gpus or t.resources.gpu_milli]
    out = []
    for i in range(count):
        x = rng.random()
        if x < gangs:
            out.append(spec(f"gang-{i}", f"team-{i % 8}", gpus=8, workers=rng.randint(2, 8), duration=duration,
                            cpu_milli=8000, memory_mib=32768))
        elif x < gangs + mig:
            out.append(spec(f"mig-{i}", f"team-{i % 8}", mig=MIG_PROFILE, duration=duration, cpu_milli=1000,
                            memory_mib=4096))
        else:
            r = rng.choice(tasks).resources
            out.append(spec(f"openb-{i}", f"team-{i % 8}", gpus=r.gpus, gpu_milli=r.gpu_milli, duration=duration,
                            cpu_milli=r.cpu_milli, memory_mib=r.memory_mib))
    return out


async def submit_backlog(client: Client, specs: list[types_pb2.JobSpec], inflight: int = 4) -> float:
    """Submit in SubmitJobs batches; the submissions/s."""
    gate = asyncio.Semaphore(inflight)
    t0 = time.perf_counter()

    async def one(chunk):
        async with gate:
            await client.submit_many([(s, "") for s in chunk])
    await asyncio.gather(*(one(specs[i:i + BATCH]) for i in range(0, len(specs), BATCH)))
    return len(specs) / (time.perf_counter() - t0)


async def read_events(bootstrap, topics: TopicNames, partitions: int = 4) -> list[ev.Event]:
    consumer = AIOKafkaConsumer(**client_args(bootstrap), enable_auto_commit=False, max_partition_fetch_bytes=8 << 20)
    await consumer.start()
    try:
        tps = [TopicPartition(topics.events, p) for p in range(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        out, left = [], {tp for tp in tps if ends[tp] > 0}
        while left:
            for tp, records in (await consumer.getmany(timeout_ms=1000, max_records=20000)).items():
                out += [codec.decode(r.value)[0] for r in records if r.value]
                if records and records[-1].offset + 1 >= ends[tp]:
                    left.discard(tp)
        return out
    finally:
        await consumer.stop()


def running_times(events: list[ev.Event]) -> tuple[dict[str, float], dict[str, float], dict[str, str]]:
    """Submit time of each job, when its attempt's last worker started (running), its kind
    (its name's first part: openb, gang, mig)."""
    submitted, workers, started, kinds = {}, {}, {}, {}
    seen: dict[tuple[str, int], set[int]] = {}
    for e in events:
        if isinstance(e, ev.JobSubmitted):
            submitted[e.job_id] = e.time
            workers[e.job_id] = e.spec.workers
            kinds[e.job_id] = e.spec.name.split("-")[0]
        elif isinstance(e, ev.WorkerStarted):
            got = seen.setdefault((e.job_id, e.attempt), set())
            got.add(e.worker)
            if len(got) == workers.get(e.job_id, 1) and e.job_id not in started:
                started[e.job_id] = e.time
    return submitted, started, kinds


def placed_times(events: list[ev.Event], started: dict[str, float]) -> dict[str, float]:
    """When each running job's attempt was placed (its ``JobPlaced``: the cycle's clock),
    so that the scheduler's rate can be told from the node hosts' reports of the starts."""
    placed: dict[str, float] = {}
    for e in events:
        if isinstance(e, ev.JobPlaced) and e.job_id in started:
            placed[e.job_id] = e.time   # the last: an attempt placed again (a proposal refused) counts once
    return placed


def placement_rates(submitted: dict[str, float], started: dict[str, float]) -> tuple[float, float, int]:
    """(jobs running / (last start - first submission), the same over the middle 80 % of
    the starts, jobs running)."""
    if not started:
        return 0.0, 0.0, 0
    times = sorted(started.values())
    first = min(submitted.values())
    whole = len(times) / max(1e-9, times[-1] - first)
    lo, hi = times[len(times) // 10], times[(9 * len(times)) // 10]
    middle = (0.8 * len(times)) / max(1e-9, hi - lo)
    return whole, middle, len(times)


def histogram(text: str, name: str) -> dict[float, float]:
    """Cumulative bucket counts of a Prometheus histogram, summed over its label sets."""
    buckets: dict[float, float] = {}
    for m in re.finditer(rf'^{name}_bucket{{([^}}]*)}} ([0-9.e+]+)$', text, re.M):
        le = re.search(r'le="([^"]+)"', m.group(1)).group(1)
        bound = float("inf") if le == "+Inf" else float(le)
        buckets[bound] = buckets.get(bound, 0.0) + float(m.group(2))
    return buckets


def quantile(values: list[float], q: float) -> float:
    """The nearest-rank quantile ``q`` of ``values`` (nan when there are none)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def cycle_report(cycles: list[dict[str, float]], longest: int = 5) -> str:
    """The burst's cycles from the placer's cycle log: exact wall-time quantiles, CPU and
    GC beside them, and the longest few with what they held."""
    if not cycles:
        return "placer cycles: none logged"
    wall = [c["wall_ms"] for c in cycles]
    cpu = [c["cpu_ms"] for c in cycles]
    lines = [f"placer cycles: {len(cycles)}, wall ms mean {sum(wall) / len(wall):,.0f}, p50 {quantile(wall, .5):,.0f}, "
             f"p99 {quantile(wall, .99):,.0f}, max {max(wall):,.0f}; CPU ms p50 {quantile(cpu, .5):,.0f}, "
             f"p99 {quantile(cpu, .99):,.0f}; GC {sum(c['gc_ms'] for c in cycles):,.0f} ms in all; after a cycle, "
             f"before its append, the pending-reasons pass (where it ran) and the rest: p50 "
             f"{quantile([c['reasons_ms'] for c in cycles], .5):,.0f} ms, max {max(c['reasons_ms'] for c in cycles):,.0f} "
             f"(exact, --cycle-log)"]
    rest = cycles[1:]   # the replica's first cycle builds what later cycles keep (cold)
    if rest:
        waited = [c["wall_ms"] - c["cpu_ms"] for c in cycles]
        # A line is written after the cycle and its pass: the next cycle started wall + pass before its line.
        between = [(c["time"] - b["time"]) * 1e3 - c["wall_ms"] - c["reasons_ms"] for b, c in zip(cycles, rest)]
        lines.append(f"  the first cycle (cold) wall {cycles[0]['wall_ms']:,.0f} ms, CPU {cycles[0]['cpu_ms']:,.0f}; "
                     f"the {len(rest)} after it: wall p99 {quantile([c['wall_ms'] for c in rest], .99):,.0f}, "
                     f"CPU p99 {quantile([c['cpu_ms'] for c in rest], .99):,.0f}; wall less CPU (the placer waiting "
                     f"for a core) p50 {quantile(waited, .5):,.0f} ms, p99 {quantile(waited, .99):,.0f}; between "
                     f"cycles (the append, its round trip through the log, rest) p50 {quantile(between, .5):,.0f} ms, "
                     f"p99 {quantile(between, .99):,.0f}")
    t0 = cycles[0]["time"]
    for c in sorted(cycles, key=lambda c: -c["wall_ms"])[:longest]:
        lines.append(f"  at +{c['time'] - t0:.1f}s: wall {c['wall_ms']:,.0f} ms, CPU {c['cpu_ms']:,.0f}, "
                     f"GC {c['gc_ms']:,.0f}; {int(c['pending'])} pending, {int(c['placed'])} placed")
    return "\n".join(lines)


async def scrape(port: int) -> str:
    def get() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
            return reply.read().decode()
    return await asyncio.to_thread(get)


async def beat_load(bootstrap, topics: TopicNames, hosts: list[str], seconds: float = 10.0) -> tuple[float, float]:
    """records/s and bytes/s of the hosts' beats topics over ``seconds``."""
    consumer = AIOKafkaConsumer(**client_args(bootstrap), enable_auto_commit=False, auto_offset_reset="latest")
    await consumer.start()
    try:
        tps = [TopicPartition(host_beats_topic(topics.prefix, h), 0) for h in hosts]
        consumer.assign(tps)
        await consumer.seek_to_end(*tps)
        records = size = 0
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for got in (await consumer.getmany(timeout_ms=500)).values():
                records += len(got)
                size += sum(len(r.value or b"") + len(r.key or b"") for r in got)
        return records / seconds, size / seconds
    finally:
        await consumer.stop()


async def why_pending(client: Client) -> None:
    """What the placer says of the jobs still pending (docs/guide/why-pending.md), by kind."""
    pending = await client.list_all(phases=(types_pb2.JOB_PHASE_PENDING,))
    if not pending:
        return
    kinds = Counter(types_pb2.PendingKind.Name(j.pending.kind) for j in pending)
    example = next((j.pending.summary for j in pending if j.pending.summary), "")
    print(f"pending: {len(pending)} ({dict(kinds.most_common())}); e.g. {example!r}")


async def takeover(cluster: LocalCluster, client: Client, placer_args: list[str],
                   wait_placed_s: float = 30.0) -> tuple[float, float, float | None]:
    """kill -9 the placer, start another (with the bench's ``placer_args``), submit one job:
    seconds from the kill until the new placer was ready, until its first cycle ended (its
    first decisions, the old one is gone), and until the job was placed (None when it was not
    within ``wait_placed_s`` of that cycle: a full cluster has no room for it)."""
    old = next(s for s in cluster.services if s.name == "placer")
    await old.kill9()
    killed = time.perf_counter()
    new = await cluster.start("placer-2", "gpusched-placer", *placer_args, timeout=1200)
    ready = time.perf_counter() - killed
    job = (await client.submit(spec("after-takeover", "t", gpus=1, duration=HOUR))).job.job_id
    while not histogram(await scrape(new.metrics_port), CYCLE).get(float("inf"), 0.0):
        await asyncio.sleep(0.2)
    cycled = time.perf_counter() - killed
    while (await client.get(job)).phase == types_pb2.JOB_PHASE_PENDING:
        if time.perf_counter() - killed > cycled + wait_placed_s:
            return ready, cycled, None
        await asyncio.sleep(0.2)   # polling one job: cheap next to reading the whole log
    return ready, cycled, time.perf_counter() - killed


async def main(args: argparse.Namespace) -> None:
    broker = Broker()
    try:
        await run(args, broker, await asyncio.to_thread(broker.start))
    finally:
        await asyncio.to_thread(broker.stop)


async def run(args: argparse.Namespace, broker: Broker, bootstrap: str) -> None:
    topics = TopicNames(f"scale-{int(time.time())}.")
    logs = Path(tempfile.mkdtemp(prefix="gpusched-scale-"))
    cycles_path = str(logs / "cycles.txt")
    cluster = LocalCluster(bootstrap, topics, logs, metrics=True)
    hosts = [f"host{i}" for i in range(args.hosts)]
    per_host = [args.nodes // args.hosts + (1 if i < args.nodes % args.hosts else 0) for i in range(args.hosts)]
    try:
        admission = await cluster.admission()
        await cluster.placer("placer", "--cycle-log", cycles_path, *shlex.split(args.placer_args))
        await cluster.preemptor("preemptor", "--heartbeat-timeout", str(args.heartbeat_timeout))
        t0 = time.perf_counter()
        await asyncio.gather(*(cluster.node_host(h, n, "8xH100-80GB", timeout=1800) for h, n in zip(hosts, per_host)))
        print(f"{args.nodes} nodes x 8 H100 on {args.hosts} node host(s): registered in {time.perf_counter() - t0:.1f}s")
        client = Client(f"127.0.0.1:{admission.port}")
        specs = openb_specs(args.backlog, args.gangs, args.mig, args.duration)
        procs = service_pids(cluster, broker)
        cpu_before = {n: cpu_seconds(p) for n, p in procs.items()}
        spies = await start_profiles(procs, args.profile)
        simulated = sim_priority(cluster, args.sim_nice)
        burst, load_before = time.time(), os.getloadavg()[0]
        rate = await submit_backlog(client, specs)
        print(f"backlog: {args.backlog} jobs ({sum(s.workers > 1 for s in specs)} gangs of 2-8 nodes, "
              f"{sum(bool(s.resources.mig_profile) for s in specs)} MIG {MIG_PROFILE}) submitted at {rate:,.0f}/s")
        cpu_then: dict[str, float] = {}   # each service's CPU when the counts last moved: the burst's end

        load_then = [load_before]

        def sample() -> None:
            cpu_then.update((n, cpu_seconds(p)) for n, p in procs.items())
            load_then[0] = os.getloadavg()[0]
        await settle(client, cycles_path, args.settle, sample)
        cpu = {n: cpu_then[n] - cpu_before[n] for n in procs}
        restore_priority(args.sim_nice)   # a takeover's placer is started by this process: not at its nice
        if simulated:
            print(f"node hosts and the submitter at nice {args.sim_nice} through the burst: {simulated}")
        await stop_profiles(spies)
        cycles = [c for c in cycle_log.read(cycles_path) if c["time"] >= burst]
        events = await read_events(bootstrap, topics)
        submitted, started, kind = running_times(events)
        whole, middle, running = placement_rates(submitted, started)
        placed_whole, placed_middle, _ = placement_rates(submitted, placed_times(events, started))
        kinds = {k: sum(1 for j in started if kind.get(j) == k) for k in ("openb", "gang", "mig")}
        print(f"running: {running} of {args.backlog} ({kinds}); placements/s submit->running: {whole:,.0f} "
              f"(first submission to last start), {middle:,.0f} sustained (middle 80 % of starts); submit->placed "
              f"(the same jobs): {placed_whole:,.0f}, {placed_middle:,.0f} sustained")
        print(cycle_report(cycles))
        print(f"load average (1 min) at the first submission {load_before:.1f}, when the counts last moved "
              f"{load_then[0]:.1f}: the cycles' wall time grows with it")
        await why_pending(client)
        print(f"CPU ms per job running, from the first submission until the counts last moved (/proc): total {sum(cpu.values()) * 1000 / max(1, running):.2f}; "
              + ", ".join(f"{n} {c * 1000 / max(1, running):.2f}" for n, c in cpu.items()))
        records, size = await beat_load(bootstrap, topics, hosts)
        print(f"heartbeats: {records:.1f} records/s, {size / 1024:.1f} KiB/s on the broker for {args.nodes} nodes "
              f"(one node-agent each would be {args.nodes} records/s)")
        procs = service_pids(cluster, broker)
        print("RSS MiB: " + ", ".join(f"{n} {rss_mib(p):,.0f}" for n, p in procs.items()))
        if not args.no_takeover:
            ready, cycled, placed = await takeover(cluster, client, shlex.split(args.placer_args))
            print(f"placer takeover: kill -9, a new placer ready {ready:.1f}s, its first cycle over {cycled:.1f}s, "
                  f"a job submitted then placed " + (f"{placed:.1f}s" if placed is not None else "never (no room)")
                  + " after the kill")
        await client.close()
    finally:
        await cluster.stop_all()
        if problem := await delete_topics(bootstrap, topics):
            print(f"could not delete topics {topics.prefix}*: {problem}")


async def settle(client: Client, cycles_path: str, quiet_s: float, moved) -> None:
    """Wait until nothing is pending and the running count rests, or the pending and
    running counts stayed the same through ``quiet_s`` seconds and the placer either
    ended two cycles since or ended none for ``quiet_s`` (a cycle over a full cluster can
    take longer than ``quiet_s``; a placer whose state moved only by its own pending
    reasons runs none). ``moved()`` is called whenever the counts change."""
    last, since, cycles_then = (-1, -1), time.monotonic(), None
    while True:
        summary = await client.summary()
        now = (summary.pending_jobs, summary.running_jobs)   # placed, then running: both must rest
        if now != last:
            last, since, cycles_then = now, time.monotonic(), None
            moved()
            await asyncio.sleep(1.0)
            continue
        if summary.pending_jobs == 0 and time.monotonic() - since >= 3.0:
            return   # all placed, and every placed job's start is in
        cycles = len(cycle_log.read(cycles_path))
        if cycles_then is None:
            cycles_then = cycles
        elif time.monotonic() - since >= quiet_s and (
                cycles >= cycles_then + 2 or time.time() - os.path.getmtime(cycles_path) >= quiet_s):
            return
        await asyncio.sleep(1.0)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--hosts", type=int, default=1, help="node hosts sharing the nodes")
    parser.add_argument("--backlog", type=int, default=5000)
    parser.add_argument("--gangs", type=float, default=0.002, help="fraction of gangs of 2-8 whole nodes")
    parser.add_argument("--mig", type=float, default=0.01, help=f"fraction of MIG {MIG_PROFILE} jobs")
    parser.add_argument("--duration", type=float, default=HOUR, help="each job's simulated run, seconds")
    parser.add_argument("--settle", type=float, default=10.0,
                        help="seconds without new starts (and two placer cycles, or none in that time) that end the run")
    parser.add_argument("--heartbeat-timeout", type=float, default=30.0)
    parser.add_argument("--profile", type=Path, default=None,
                        help="write each service's py-spy profile of the burst (raw stacks) into this folder")
    parser.add_argument("--placer-args", default="", help="more flags for the placer, e.g. '--max-job-test 500' or '--max-cycle-ms 50'")
    parser.add_argument("--sim-nice", type=int, default=0,
                        help="nice value of the node hosts and the submitter through the burst (they stand for other "
                             "machines); 0: every process at the same priority")
    parser.add_argument("--no-takeover", action="store_true", help="skip the placer takeover step")
    asyncio.run(main(parser.parse_args()))
