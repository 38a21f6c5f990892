"""``gpusched demo``: a local cluster on a real broker, a mixed workload through gRPC,
and what happened.

Starts the broker with deploy/kafka.sh unless KAFKA_BOOTSTRAP_SERVERS names one, then
admission, placer, preemptor and simulated node-agents as separate processes, exactly as
in production, on fresh topics. The preemptor lets an attempt be preempted for priority
once it is ``--min-runtime`` old (seconds; production's default is 10 minutes) and with
no bound on the work it loses (``--max-loss-per-wait``), so the README's tour shows a
preemption at once. Submits training jobs, GPU shares, MIG slices and 2-node
gangs, follows them to the end and prints jobs run, allocation and time, then GPU-hours
allocated vs used as the agents measured them (simulated nodes: the usage model, marked
[simulated]) and the jobs that held GPUs idle.

With --serve the cluster stays up after the report, for the gpusched commands
(README: a five-minute tour), until Ctrl-C. At the end the demo stops its services,
deletes its topics, the nodes' report, beats and work-view topics included
(--keep-topics keeps them), and says what it left: the broker, which it leaves running
for the next run, and the services' log folder.
"""
from __future__ import annotations

import argparse
import asyncio
import math
import os
import signal
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path

from gpusched.adapters.broker import dev_pki
from gpusched.adapters.broker.kafka_acls import grant_service_acls
from gpusched.adapters.broker.kafka_admin import TopicNames, delete_topics, ensure_topics
from gpusched.adapters.broker.kafka_security import KafkaConnection, Where
from gpusched.client import Client, ClientTls, seconds
from gpusched.consumers.usage_report import number_type, collect, format_report
from gpusched.consumers.utilization import UtilizationLedger
from gpusched.ctl.output import milli_of
from gpusched.local_cluster import LocalCluster
from gpusched.v1 import types_pb2
from gpusched.workloads import mixed_jobs

REPO = Path(__file__).resolve().parents[1]


def ensure_broker() -> tuple[Where, str]:
    """The broker, and a line saying whose it is and how to stop it."""
    if os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):   # its login too, from GPUSCHED_KAFKA_*
        return KafkaConnection.from_env(), "the broker in KAFKA_BOOTSTRAP_SERVERS is yours: left as it was"
    kafka_sh = ["bash", str(REPO / "deploy" / "kafka.sh")]
    was_running = subprocess.run([*kafka_sh, "status"], stdout=subprocess.DEVNULL).returncode == 0
    out = subprocess.run([*kafka_sh, "start"], check=True, stdout=subprocess.PIPE, text=True).stdout
    bootstrap = out.strip().splitlines()[-1]
    started = "was running already" if was_running else "was started by the demo"
    return bootstrap, (f"the Kafka broker at {bootstrap} {started} and is left running for the next run; "
                       f"stop it: bash deploy/kafka.sh stop (delete its data too: bash deploy/kafka.sh clean)")


async def sample_utilization(client: Client, samples: list[float], stop: asyncio.Event) -> None:
    while not stop.is_set():
        summary = await client.summary()
        samples.append(summary.allocation_ratio)
        try:
            await asyncio.wait_for(stop.wait(), 0.25)
        except asyncio.TimeoutError:
            pass


async def run_demo(args: argparse.Namespace) -> int:
    bootstrap, broker_note = ensure_broker()
    topics = TopicNames(f"demo-{int(time.time())}.")
    logs = Path(tempfile.mkdtemp(prefix="gpusched-demo-"))
    # --secure: TLS and a bearer token, as a production cluster; throwaway credentials.
    pki = dev_pki.write(logs / "pki", [{"principal": "demo", "role": "operator"}]) if args.secure else None
    cluster = LocalCluster(bootstrap, topics, logs, partitions=4, pki=pki)
    print(f"broker {bootstrap}; topics {topics.prefix}*; service logs in {logs}")
    try:
        if cluster.connection.secured:   # services may not create topics there: set up as kafka-setup does
            await ensure_topics(cluster.connection, topics, 4)
            await grant_service_acls(cluster.connection, topics)
        return await _run(cluster, bootstrap, topics, pki, args)
    finally:
        await cluster.stop_all()
        kept = f"topics {topics.prefix}* kept" if args.keep_topics else await _delete(bootstrap, topics)
        print(f"\nstopped the demo's services; {kept}; service logs left in {logs} (delete when done)"
              f"\n{broker_note}")


async def _delete(bootstrap: Where, topics: TopicNames) -> str:
    why_not = await delete_topics(bootstrap, topics, timeout_s=10)
    return f"topics {topics.prefix}* deleted" if not why_not else f"topics {topics.prefix}* not deleted ({why_not})"


def _ratio(text: str) -> float:
    """A number >= 0, ``inf`` included (no bound)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number >= 0 (or inf)")
    return value


async def _run(cluster: LocalCluster, bootstrap: Where, topics: TopicNames, pki, args: argparse.Namespace) -> int:
    admission = await cluster.admission("admission", args.port)
    await cluster.placer()
    await cluster.preemptor("preemptor", "--min-runtime", repr(args.min_runtime),
                            "--max-loss-per-wait", repr(args.max_loss_per_wait))
    usage = ["--usage-interval", str(args.usage_interval)]
    if args.idle_jobs:
        usage += ["--simulated-usage", f"{args.idle_jobs}=0"]
    await asyncio.gather(*(cluster.agent(f"node-{i}", args.gpus, "--label", f"rack=r{i // 2}", *usage)
                           for i in range(args.nodes)))
    client = (Client(f"127.0.0.1:{admission.port}", ClientTls.from_files(pki.ca), pki.tokens["demo"]) if pki
              else Client(f"127.0.0.1:{admission.port}"))
    if pki:
        print(f"APIs over TLS; throwaway credentials in {pki.directory}")
    print(f"cluster up: admission :{admission.port}, placer, preemptor (jobs may be preempted for priority after "
          f"{args.min_runtime:g}s), {args.nodes} simulated nodes x {args.gpus}")
    specs = mixed_jobs(args.jobs, seed=args.seed, duration=(args.min_duration, args.max_duration))
    samples: list[float] = []
    stop = asyncio.Event()
    sampler = asyncio.create_task(sample_utilization(client, samples, stop))
    t0 = time.perf_counter()
    ids = {r.job.job_id for r in await asyncio.gather(*(client.submit(s) for s in specs))}
    t_submit = time.perf_counter() - t0
    jobs = await client.wait_terminal(ids)
    makespan = time.perf_counter() - t0
    stop.set()
    await sampler
    _report(jobs, t_submit, makespan, samples, args)
    await client.close()
    await _usage_report(bootstrap, topics, args)
    ok = all(j.phase == types_pb2.JOB_PHASE_SUCCEEDED for j in jobs)
    if args.serve:
        await _serve(admission.port, pki)
    return 0 if ok else 1


async def _serve(port: int, pki) -> None:
    """Keep the cluster up for the gpusched commands until Ctrl-C (or SIGTERM)."""
    print(f"\nthe cluster stays up for the gpusched commands (Ctrl-C stops it); in another shell:\n"
          f"  export GPUSCHED_ENDPOINT=127.0.0.1:{port}"
          + (f" GPUSCHED_CA={pki.ca} GPUSCHED_TOKEN={pki.tokens['demo']}" if pki else "") +
          "\n  .venv/bin/gpusched get nodes", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


def _report(jobs, t_submit, makespan, samples, args) -> None:
    phases = Counter(types_pb2.JobPhase.Name(j.phase).removeprefix("JOB_PHASE_").lower() for j in jobs)
    shapes = Counter(j.spec.name.split("-")[0] for j in jobs)
    gpu_s = sum(j.spec.workers * milli_of(j.spec.resources) / 1000 * (seconds(j.ended_at) - seconds(j.started_at))
                for j in jobs if seconds(j.started_at))
    capacity = args.nodes * int(args.gpus.split("x")[0]) * makespan
    waits = sorted(seconds(j.started_at) - seconds(j.submitted_at) for j in jobs if seconds(j.started_at))
    print(f"\n{len(jobs)} jobs submitted in {t_submit:.2f}s ({len(jobs) / t_submit:.0f}/s); all ended after {makespan:.1f}s")
    print("by outcome: " + ", ".join(f"{k} {v}" for k, v in sorted(phases.items())))
    print("by shape:   " + ", ".join(f"{k} {v}" for k, v in sorted(shapes.items())))
    print(f"preemptions: {sum(j.preemptions for j in jobs)} (jobs requeued for higher-priority work)")
    print(f"GPU allocation (GPU-seconds allocated / available): {gpu_s / capacity:.1%}")
    print(f"GPU allocation sampled every 0.25 s: mean {sum(samples) / max(1, len(samples)):.1%}, peak {max(samples, default=0):.1%}")
    if waits:
        print(f"queueing delay submit->running: p50 {waits[len(waits) // 2]:.2f}s, p99 {waits[int(len(waits) * 0.99)]:.2f}s")


async def _usage_report(bootstrap: Where, topics: TopicNames, args: argparse.Namespace) -> None:
    """Allocated vs used from the log and the agents' usage records (``gpusched usage``)."""
    if not args.usage_interval:
        return
    ledger = UtilizationLedger(idle_after_s=args.idle_after)
    await collect(bootstrap, topics, ledger)
    print("\n" + format_report(ledger.report(now=time.time()), ledger))


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--serve", action="store_true",
                        help="after the report, keep the cluster up for the gpusched commands until Ctrl-C")
    parser.add_argument("--port", type=int, default=0, help="admission's port (default: any free one)")
    parser.add_argument("--keep-topics", action="store_true",
                        help="keep the demo's topics (for gpusched usage --topic-prefix, or the billing and audit consumers, afterwards)")
    parser.add_argument("--secure", action="store_true",
                        help="serve the APIs over TLS with tokens and a policy (a throwaway dev CA); "
                             "default: the --insecure dev mode on loopback (docs/reference/security.md)")
    parser.add_argument("--gpus", default="8xH100-80GB", help="simulated GPUs per node")
    parser.add_argument("--min-runtime", type=number_type(0.0), default=5.0,
                        help="seconds an attempt runs before it may be preempted for priority (the preemptor's "
                             "--min-runtime; its default, 600, would keep the tour from showing one)")
    parser.add_argument("--max-loss-per-wait", type=_ratio, default=float("inf"),
                        help="the preemptor's --max-loss-per-wait (default: no bound; the cluster default, "
                             "0.02, would keep the tour's job waiting long before it preempts)")
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--min-duration", type=float, default=0.5)
    parser.add_argument("--max-duration", type=float, default=3.0)
    parser.add_argument("--usage-interval", type=number_type(0.0), default=0.25,
                        help="seconds between the agents' GPU usage samples (0: no usage report)")
    parser.add_argument("--idle-jobs", default="", metavar="PATTERN",
                        help="jobs named like PATTERN (e.g. 'infer-*') hold their GPUs idle, to show idle detection")
    parser.add_argument("--idle-after", type=number_type(0.0, low_open=True), default=1.0,
                        help="seconds below 5%% SM after which a job is reported idle")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpusched demo", description=__doc__)
    add_args(parser)
    return asyncio.run(run_demo(parser.parse_args(argv)))
