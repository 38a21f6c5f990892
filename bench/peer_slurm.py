"""Side by side with a peer: the same job stream through Slurm and through gpusched, on
this machine, alternating (Slurm default, gpusched, Slurm tuned, gpusched, ... per round).

Both run 4 nodes x 8 GPUs (Slurm: fake GPUs in gres.conf, bench/slurm_cluster.py;
gpusched: node-agents with ``--simulate 8xH100-80GB --run-processes``). Every job asks
for one GPU and is a real process started by the node's daemon (slurmd's slurmstepd, the
node-agent's shim): ``sh -c 'date +%s.%N > <dir>/<job id>'``, so the job itself records
when it started. Each side is fed by its ordinary client: ``sbatch`` for Slurm, the gRPC
``SubmitJob`` call (gpusched.client) for gpusched.

1. Burst: ``--jobs`` jobs submitted with ``--concurrency`` submissions in flight; completed
   jobs/s = jobs / (first submission until the last job has ended and left the queue).
2. Steady: open-loop arrivals at ``--rate`` jobs/s for ``--seconds``; submit-to-start =
   the job's own start stamp minus the client's clock just before its submission call
   (gpusched: also the log's RUNNING time, ``started_at``).

After each of gpusched's bursts, where a GPU slot's turnaround goes (from one job's end to
the next job's start on that node's GPU, ``peer_stages.slot_breakdown``); after each steady
stream, where submit-to-start goes (``peer_stages.breakdown``).

Run by bench/peer_slurm.sh (installs Slurm, starts a private Kafka broker):

    bash bench/peer_slurm.sh [--jobs 200 --rate 50 --seconds 6 --rounds 2]
"""
from __future__ import annotations

import argparse
import asyncio
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

# Bursts of one team's jobs are the point: admission's per-team rate and pending limits
# (docs/reference/api-errors.md) are off for the services started here.
os.environ.setdefault("GPUSCHED_SUBMIT_RATE", "0")
os.environ.setdefault("GPUSCHED_MAX_PENDING_PER_TEAM", "0")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from peer_cpu import cpu_seconds  # noqa: E402
from slurm_cluster import TUNED, SlurmCluster, SlurmLayout  # noqa: E402

from gpusched.ports import free_ports  # noqa: E402

STAMP = "date +%s.%N > {dir}/${id_var}"   # the job: record its own start, then exit


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile (nearest rank, 0 < q <= 1) of ``values``; NaN when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = math.ceil(q * len(ordered) - 1e-9)   # the margin: 0.99 * 100 must be rank 99, not 100
    return ordered[min(len(ordered), max(1, rank)) - 1]


def ratio(ours: float, theirs: float) -> float:
    """``ours / theirs``; NaN when ``theirs`` is zero or either is NaN."""
    return ours / theirs if theirs else float("nan")


def job_script(directory: Path, id_var: str) -> str:
    return STAMP.format(dir=directory, id_var=id_var)


def read_stamps(directory: Path) -> dict[str, float]:
    """job id -> the start time the job wrote."""
    stamps = {}
    for path in directory.iterdir():
        try:
            stamps[path.name] = float(path.read_text())
        except ValueError:   # still being written: the job has not finished its one line
            continue
    return stamps


@dataclass
class Result:
    """One side's figures of one round."""
    side: str
    accepted_per_s: float = float("nan")   # burst submissions/s
    completed_per_s: float = float("nan")  # burst jobs/s, submit until all ended
    ran: int = 0                           # burst jobs whose start stamp is there
    cpu_ms: dict[str, float] = field(default_factory=dict)  # burst: CPU ms per job of each daemon
    start_ms: list[float] = field(default_factory=list)     # steady: submit -> the job's own stamp
    running_ms: list[float] = field(default_factory=list)   # steady: submit -> the log's RUNNING (gpusched)
    calm_ms: list[float] = field(default_factory=list)      # the same at --calm-rate: no queue builds up

    def line(self) -> str:
        lat = f"submit->start p50 {pct(self.start_ms, .5):8.1f} ms p99 {pct(self.start_ms, .99):8.1f} ms"
        if self.running_ms:
            lat += f" (log RUNNING p50 {pct(self.running_ms, .5):.1f} p99 {pct(self.running_ms, .99):.1f} ms)"
        cpu = "  ".join(f"{name} {ms:.1f}" for name, ms in self.cpu_ms.items())
        return (f"  {self.side:14s} burst: {self.accepted_per_s:7.1f} accepted/s {self.completed_per_s:7.1f} "
                f"completed jobs/s ({self.ran} ran); steady: {lat}\n"
                f"  {'':14s} calm: submit->start p50 {pct(self.calm_ms, .5):.1f} ms p99 {pct(self.calm_ms, .99):.1f} ms\n"
                f"  {'':14s} burst CPU ms/job: {cpu}; total {sum(self.cpu_ms.values()):.1f}")


class Side:
    """What the measurements need from a scheduler: submit one job, jobs still held, and
    the pids of its daemons (name -> pid) whose CPU per job is reported."""
    name = ""
    id_var = ""
    pids: dict[str, list[int]] = {}
    # The other side's daemons: children of this process too, idle while this side runs,
    # so left out of the client's descendants.
    elsewhere: frozenset[int] = frozenset()

    async def submit(self, script: str) -> str:
        raise NotImplementedError

    async def held(self) -> int:
        raise NotImplementedError

    async def running_ms(self, sent: dict[str, float]) -> list[float]:
        return []

    async def stages(self, sent: dict[str, float], stamps: dict[str, float]) -> list[str]:
        return []

    async def slot_stages(self, ids: set[str]) -> list[str]:
        return []


class SlurmSide(Side):
    id_var = "SLURM_JOB_ID"

    def __init__(self, cluster: SlurmCluster, tuned: bool, elsewhere: frozenset[int] = frozenset()) -> None:
        self.cluster, self.name = cluster, "slurm-tuned" if tuned else "slurm-default"
        self.pids = {**cluster.pids(), "sbatch+client": [os.getpid()]}
        self.elsewhere = elsewhere

    async def submit(self, script: str) -> str:
        return await self.cluster.submit(script)

    async def held(self) -> int:
        return await self.cluster.queued()


# Every phase but the ends: a placed job has not started yet, a stopping one still holds its GPU.
UNENDED = (1, 2, 3, 4, 8)   # types_pb2.JOB_PHASE_ PENDING, PLACED, RUNNING, PREEMPTING, STOPPING


class GpuschedSide(Side):
    name, id_var = "gpusched", "GPUSCHED_JOB_ID"

    def __init__(self, client, pids: dict[str, list[int]], elsewhere: frozenset[int] = frozenset(),
                 work: Path | None = None, log: tuple | None = None) -> None:
        self.client = client
        self.log = log     # (KafkaConnection, TopicNames, node names): the topics whose record times it reads
        self.work = work   # the agents' state folders are under it (their worker folders)
        self.pids = pids   # service name -> pid, for the CPU each spends per job
        self.elsewhere = elsewhere

    async def submit(self, script: str) -> str:
        from gpusched.client import spec
        job = spec("peer", "peer", gpus=1, cpu_milli=1000, memory_mib=1024, command=("sh", "-c", script))
        return (await self.client.submit(job)).job.job_id

    async def held(self) -> int:
        return len(await self.client.list_all(team="peer", phases=UNENDED))

    async def running_ms(self, sent: dict[str, float]) -> list[float]:
        from gpusched.client import seconds
        jobs = await self.client.list_all(team="peer")
        return [1000 * (seconds(j.started_at) - sent[j.job_id]) for j in jobs
                if j.job_id in sent and j.started_at.seconds]

    async def stages(self, sent: dict[str, float], stamps: dict[str, float]) -> list[str]:
        from peer_stages import breakdown
        return breakdown(await self.client.list_all(team="peer"), sent, stamps, self.work, pct)

    async def slot_stages(self, ids: set[str]) -> list[str]:
        from peer_stages import record_times, slot_breakdown
        if self.log is None:
            return []
        jobs = [j for j in await self.client.list_all(team="peer") if j.job_id in ids]
        return slot_breakdown(jobs, self.work, await record_times(*self.log), pct)


async def drained(side: Side, timeout: float = 600.0) -> None:
    deadline = time.monotonic() + timeout
    while await side.held():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{side.name}: jobs still queued after {timeout:g}s")
        await asyncio.sleep(0.1)   # poll period, the same for both sides


async def burst(side: Side, out: Path, jobs: int, concurrency: int, result: Result) -> None:
    script = job_script(out, side.id_var)
    sem = asyncio.Semaphore(concurrency)
    ids: set[str] = set()

    async def one() -> None:
        async with sem:
            ids.add(await side.submit(script))
    def used() -> dict[str, float]:
        everyone = {pid for pids in side.pids.values() for pid in pids} | side.elsewhere
        return {name: cpu_seconds(*pids, others=frozenset(everyone - set(pids))) for name, pids in side.pids.items()}
    before = used()
    t0 = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(jobs)))
    result.accepted_per_s = jobs / (time.perf_counter() - t0)
    await drained(side)
    result.completed_per_s = jobs / (time.perf_counter() - t0)
    after = used()
    result.cpu_ms = {name: 1000 * (after[name] - before[name]) / jobs for name in side.pids}
    result.ran = len(read_stamps(out))
    if lines := await side.slot_stages(ids):
        print(f"  {side.name} burst, " + "\n".join(lines).lstrip(), flush=True)


async def steady(side: Side, out: Path, rate: float, seconds: float) -> tuple[list[float], list[float]]:
    """Submit-to-start of each job of an open-loop stream (ms): the job's own stamp, and the
    log's RUNNING time where the side has one."""
    script = job_script(out, side.id_var)
    sent: dict[str, float] = {}

    async def one() -> None:
        t = time.time()
        sent[await side.submit(script)] = t
    tasks = []
    t0 = time.perf_counter()
    for i in range(int(rate * seconds)):
        delay = t0 + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)   # open-loop arrival clock, not synchronisation
        tasks.append(asyncio.create_task(one()))
    await asyncio.gather(*tasks)
    await drained(side)
    stamps = read_stamps(out)
    if lines := await side.stages(sent, stamps):
        print(f"  {side.name} at {rate:g} jobs/s, " + "\n".join(lines).lstrip(), flush=True)
    return [1000 * (stamps[j] - t) for j, t in sent.items() if j in stamps], await side.running_ms(sent)


async def measure(side: Side, work: Path, args: argparse.Namespace) -> Result:
    result = Result(side.name)
    run = Path(tempfile.mkdtemp(prefix=f"{side.name}-", dir=work))
    (run / "burst").mkdir()
    (run / "steady").mkdir()
    (run / "calm").mkdir()
    await burst(side, run / "burst", args.jobs, args.concurrency, result)
    result.start_ms, result.running_ms = await steady(side, run / "steady", args.rate, args.seconds)
    if args.calm_rate:
        result.calm_ms, _ = await steady(side, run / "calm", args.calm_rate, args.calm_seconds)
    print(result.line(), flush=True)
    return result


# (label, figure of a round); the first is a rate (more is better), the rest latencies in ms.
FIGURES = (("completed jobs/s", lambda r: r.completed_per_s),
           ("p50 submit->start", lambda r: pct(r.start_ms, .5)),
           ("p99 submit->start", lambda r: pct(r.start_ms, .99)),
           ("calm p50", lambda r: pct(r.calm_ms, .5)),
           ("calm p99", lambda r: pct(r.calm_ms, .99)))


def summary(results: list[Result]) -> list[str]:
    """The medians per side over the rounds, and gpusched's ratios to each Slurm setting:
    xN for the rate (N times Slurm's), 1/N for a latency (a Nth of Slurm's)."""
    by_side: dict[str, list[Result]] = {}
    for r in results:
        by_side.setdefault(r.side, []).append(r)
    med = {side: [statistics.median(figure(r) for r in rs) for _, figure in FIGURES] for side, rs in by_side.items()}
    lines = [f"  {side:14s} " + "  ".join(f"{label} {value:.1f}" for (label, _), value in zip(FIGURES, values))
             for side, values in med.items()]
    ours = med.get("gpusched")
    for side, theirs in med.items():
        if ours is None or side == "gpusched":
            continue
        parts = [f"{FIGURES[0][0]} x{ratio(ours[0], theirs[0]):.2f}"]
        parts += [f"{label} 1/{ratio(t, o):.1f}" for (label, _), o, t in zip(FIGURES[1:], ours[1:], theirs[1:])]
        lines.append(f"  gpusched vs {side}: " + "; ".join(parts))
    return lines


def broker_pid() -> int | None:
    """The private broker's pid (bench/peer_slurm.sh starts it with GPUSCHED_RUN_DIR)."""
    try:
        return int((Path(os.environ["GPUSCHED_RUN_DIR"]) / "kafka" / "kafka.pid").read_text())
    except (KeyError, OSError, ValueError):
        return None


async def gpusched_cluster(work: Path, args: argparse.Namespace):
    from gpusched.adapters.broker.kafka_security import KafkaConnection
    from gpusched.adapters.broker.kafka_admin import TopicNames
    from gpusched.local_cluster import LocalCluster

    topics = TopicNames(f"peer-{int(time.time())}.")
    from gpusched.adapters.broker.kafka_admin import delete_topics
    cluster = LocalCluster(KafkaConnection.from_env(), topics, work / "gpusched-logs")
    try:
        # The relay writes each node's work view by default; agents on the log need none.
        admission = await cluster.admission("admission", 0, *["--no-work-views"][:args.agent_source == "log"])
        await cluster.placer()
        await cluster.preemptor()
        agent = ("--run-processes", "--source", args.agent_source, "--state-dir")
        await asyncio.gather(*(cluster.agent(f"peer-n{i}", f"{args.gpus}xH100-80GB", *agent, str(work / f"agent-n{i}"))
                               for i in range(1, args.nodes + 1)))
    except BaseException:   # one did not start: stop those that did, which would outlive the run
        await cluster.stop_all()
        await delete_topics(cluster.connection, cluster.topics)
        raise
    return cluster, admission


async def main(args: argparse.Namespace) -> None:
    from gpusched.adapters.broker.kafka_admin import delete_topics
    from gpusched.client import Client

    work = Path(tempfile.mkdtemp(prefix="peer-slurm-", dir=args.work_dir))
    port = args.slurm_port or free_ports(args.nodes + 1, "Slurm")
    slurm = SlurmCluster(SlurmLayout(work / "slurm", nodes=args.nodes, gpus=args.gpus, port=port))
    cluster, client = None, None
    try:
        cluster, admission = await gpusched_cluster(work, args)
        client = Client(f"127.0.0.1:{admission.port}")
        pids = {s.name: [s.proc.pid] for s in cluster.services}
        if broker := broker_pid():
            pids["broker"] = [broker]
        pids["client"] = [os.getpid()]
        if not args.gpusched_only:
            slurm.start(tuned=False)
        print(f"{args.nodes} nodes x {args.gpus} GPUs each side; burst {args.jobs} jobs, {args.concurrency} "
              f"submissions in flight; steady {args.rate:g} jobs/s for {args.seconds:g}s, calm {args.calm_rate:g} "
              f"jobs/s; files in {work}{'' if args.keep else ' (deleted at the end; --keep keeps them)'}")
        print(f"tuned Slurm: {', '.join(f'{k}={v}' for k, v in TUNED.items())}")
        log = (cluster.connection, cluster.topics, [f"peer-n{i}" for i in range(1, args.nodes + 1)])
        ours = frozenset(pid for group in pids.values() for pid in group if pid != os.getpid())
        results = []
        for r in range(args.rounds):
            print(f"round {r + 1}:", flush=True)
            for tuned in (False, True):
                if not args.gpusched_only:
                    if r or tuned:
                        slurm.reconfigure(tuned)
                    results.append(await measure(SlurmSide(slurm, tuned, elsewhere=ours), work, args))
                theirs = frozenset(pid for group in slurm.pids().values() for pid in group)
                results.append(await measure(GpuschedSide(client, pids, elsewhere=theirs, work=work, log=log), work, args))
        print("medians over the rounds:")
        print("\n".join(summary(results)))
    finally:
        slurm.stop()
        if client is not None:
            await client.close()
        if cluster is not None:
            await cluster.stop_all()
            await delete_topics(cluster.connection, cluster.topics)   # a shared broker keeps no leftovers
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=200, help="jobs in each burst")
    parser.add_argument("--concurrency", type=int, default=8, help="submissions in flight in a burst")
    parser.add_argument("--rate", type=float, default=50, help="steady arrivals, jobs/s")
    parser.add_argument("--seconds", type=float, default=6, help="how long the steady stream lasts")
    parser.add_argument("--calm-rate", type=float, default=5,
                        help="a second stream at a rate both sides keep up with, jobs/s (0: none)")
    parser.add_argument("--calm-seconds", type=float, default=6)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--gpus", type=int, default=8, help="GPUs per node")
    parser.add_argument("--slurm-port", type=int, default=0,
                        help="slurmctld's port, the slurmds' the next ones (0: a free run of ports)")
    parser.add_argument("--agent-source", choices=("log", "view"), default="view",
                        help="what gpusched's node-agents read: their work view (their default) or the pool's log")
    parser.add_argument("--gpusched-only", action="store_true",
                        help="leave Slurm out: gpusched's figures alone (to profile it; no ratios)")
    parser.add_argument("--keep", action="store_true", help="keep the run's folder (logs, stamps, Slurm files)")
    parser.add_argument("--work-dir", default=None, help="parent of the run's folder (default: the temp dir)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse()))
