"""Benchmark: replaying a pool log, and how fast a new placer replica resumes a pool.

1. Generates a pool log of N events (default 1,000,000) into fresh topics on the broker:
   node registrations, submissions (whole GPUs, shares, MIG slices, 2-node gangs),
   valid ``JobPlaced`` proposals (first fit, synthesised here; a few stale ones are
   rejected by the reducer, as in real logs), worker starts, checkpoints, successes,
   failures with retries, cancellations, GPU faults and node loss/re-registration, so the
   state keeps thousands of nodes and jobs live. Every event is folded through the
   reducer while generating, so the log is one the services could have written.
2. (a) Full replay into a fresh ``LogFollower`` as the services run it (a partition
   100,000 records or more behind is rebuilt with a catch-up reader process, see
   ``gpusched.adapters.catchup``): events/s, and the CPU of each process. ``--serial-too``
   also times each replay in one process (parallel catch-up off).
3. (b) Resume: a new placer-like replica (fresh process, consumer-group member, as
   ``gpusched-placer`` builds its follower) from process start to "state caught up, ready
   to schedule" — with a snapshot written near the end of the log, and without one.
4. Snapshot size and the time to copy/serialise/restore the end state.

    .venv/bin/python bench/replay_bench.py [--events 1000000] [--bootstrap 127.0.0.1:19092]

The broker comes from ``--bootstrap`` / KAFKA_BOOTSTRAP_SERVERS (``deploy/kafka.sh start``
runs one on 127.0.0.1:19092). Topics are ``bench-replay-<hex>.*`` and are deleted at the
end unless ``--keep``. ``--reuse PREFIX`` measures again on topics kept by an earlier run.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import resource
import secrets
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from aiokafka import AIOKafkaProducer  # noqa: E402

from gpusched import native  # noqa: E402
from gpusched.adapters import codec  # noqa: E402
from gpusched.adapters.follower import FollowerOptions, LogFollower  # noqa: E402
from gpusched.adapters.publisher import DeadLetters, EventPublisher, partition_for  # noqa: E402
from gpusched.adapters.forked_snapshot import CAN_FORK, snapshot_bytes_forked  # noqa: E402
from gpusched.adapters.kafka_admin import TopicNames, delete_topics, ensure_topics, wait_for_broker  # noqa: E402
from gpusched.adapters.kafka_security import KafkaConnection, client_args  # noqa: E402
from gpusched.adapters.restore import decode_state  # noqa: E402
from gpusched.adapters.snapshots import SnapshotStore, capture_state, encode_state  # noqa: E402
from gpusched.config import DEFAULT_JOB_RETENTION_S, PARALLEL_REPLAY_MIN  # noqa: E402
from gpusched.core import events as ev  # noqa: E402
from gpusched.core.catalog import CATALOG  # noqa: E402
from gpusched.core.digest import digest  # noqa: E402
from gpusched.core.mig import PROFILES  # noqa: E402
from gpusched.core.model import GpuInfo, GpuSlot, JobKind, JobSpec, NodeInfo, WorkerAssignment, WorkerResources  # noqa: E402
from gpusched.core.reducer import apply  # noqa: E402
from gpusched.core.state import ClusterState  # noqa: E402

POOL = "default"
PARTITIONS = 4
NODE_MODELS = ("H100-80GB", "H100-80GB", "A100-80GB", "L40S-48GB")
TEAMS = ("vision", "speech", "llm", "ads", "search", "robotics")


# --- the workload ---------------------------------------------------------------------
class _Full(Exception):
    """The log has its events."""


class PoolSim:
    """Drives one pool: every event it emits is applied to ``self.state`` at once."""

    def __init__(self, seed: int, nodes: int, retention_s: float = 0.0) -> None:
        self.rng = random.Random(seed)
        self.state = ClusterState()
        self.retention_s = retention_s   # recorded as the log's first event, as admission does
        self.now = 1_700_000_000.0
        self.jobs = 0
        self.events: list[ev.Event] = []
        self.accepted = 0
        self.node_names = [f"node-{i:05d}" for i in range(nodes)]
        self.agents = {n: f"node-agent-{secrets.token_hex(4)}" for n in self.node_names}
        self.placer = f"placer-{secrets.token_hex(4)}"
        self.admission = f"admission-{secrets.token_hex(4)}"
        self.running: list[str] = []      # jobs with workers placed (maybe started)
        self.lost: list[str] = []         # nodes lost, to come back later
        self.steps = 40                   # progress steps per round: fewer than arrivals need, so work piles up
        self.limit = 0
        self.snap: bytes | None = None

    def _id(self) -> str:
        return "%032x" % self.rng.getrandbits(128)   # like uuid4().hex

    def emit(self, cls, producer: str, **kw) -> bool:
        if len(self.events) >= self.limit:
            raise _Full
        self.now += self.rng.expovariate(50.0)
        e = cls(event_id=self._id(), time=self.now, producer=producer, **kw)
        self.events.append(e)
        out = apply(self.state, e)
        self.accepted += out.accepted
        return out.accepted

    # -- nodes --
    def node_info(self, name: str) -> NodeInfo:
        model = NODE_MODELS[int(name.rsplit("-", 1)[1]) % len(NODE_MODELS)]
        cat = CATALOG[model]
        return NodeInfo(
            name=name, pool=POOL, cpu_milli=192_000, memory_mib=2_048_000,
            gpus=tuple(GpuInfo(i, f"GPU-{name}-{i}-{secrets.token_hex(6)}", model, cat.memory_mib, cat.mig_capable)
                       for i in range(8)),
            labels=(("rack", f"r{int(name[-5:]) // 32}"), ("zone", "z1")), agent_id=self.agents[name],
        )

    def register_all(self) -> None:
        for name in self.node_names:
            self.emit(ev.NodeRegistered, self.agents[name], node=self.node_info(name))

    # -- jobs --
    def spec(self, i: int) -> JobSpec:
        r = self.rng.random()
        team = self.rng.choice(TEAMS)
        if r < 0.50:
            res, workers, kind, name = WorkerResources(gpus=self.rng.choice([1, 1, 2, 4, 8]), cpu_milli=8000,
                                                       memory_mib=64_000), 1, JobKind.TRAINING, f"train-{i}"
        elif r < 0.75:
            res, workers, kind, name = WorkerResources(gpu_milli=self.rng.choice([100, 250, 500]), cpu_milli=2000,
                                                       memory_mib=16_000), 1, JobKind.INFERENCE, f"infer-{i}"
        elif r < 0.90:
            res, workers, kind, name = WorkerResources(mig_profile=self.rng.choice(["1g", "2g", "3g"]), cpu_milli=2000,
                                                       memory_mib=16_000), 1, JobKind.INFERENCE, f"mig-{i}"
        else:
            res, workers, kind, name = WorkerResources(gpus=8, cpu_milli=64_000, memory_mib=512_000), 2, \
                JobKind.TRAINING, f"gang-{i}"
        return JobSpec(name=name, team=team, pool=POOL, kind=kind, workers=workers, resources=res,
                       priority_class=self.rng.choice(["training", "training", "production-inference"]),
                       checkpoint_interval_s=600.0, command=("python", "-m", "train", f"--run={i}"),
                       simulated_duration_s=round(self.rng.uniform(30, 3600), 1), org="org-1")

    def submit(self) -> None:
        self.jobs += 1
        self.emit(ev.JobSubmitted, self.admission, job_id=f"job-{self.jobs:08d}", spec=self.spec(self.jobs),
                  idempotency_key=f"key-{self.jobs}" if self.rng.random() < 0.3 else "")

    def _slots(self, node, res: WorkerResources, taken: set[int]) -> tuple[GpuSlot, ...] | None:
        gpus = node.gpus
        if res.mig_profile:
            p = PROFILES[res.mig_profile]
            for i, g in enumerate(gpus):
                if i not in taken and g.info.mig_capable:
                    for s in p.starts:
                        if g.fits_mig(p, s):
                            return (GpuSlot(i, p.milli, res.mig_profile, s),)
            return None
        if res.gpu_milli:
            for i, g in enumerate(gpus):
                if i not in taken and g.fits_share(res.gpu_milli):
                    return (GpuSlot(i, res.gpu_milli),)
            return None
        free = [i for i, g in enumerate(gpus) if i not in taken and g.fits_whole()]
        return tuple(GpuSlot(i) for i in free[:res.gpus]) if len(free) >= res.gpus else None

    def place_some(self, limit: int) -> None:
        """First fit from random nodes for the oldest pending jobs (a cheap stand-in for
        the Scheduler over thousands of nodes; the reducer checks every proposal)."""
        st = self.state
        for job_id in list(st.pending)[:limit]:
            job = st.jobs[job_id]
            res = job.spec.resources
            workers = []
            for w in range(job.spec.workers):
                for _ in range(12):
                    node = st.nodes[self.rng.choice(self.node_names)]
                    if not node.schedulable or node.free_cpu < res.cpu_milli or node.free_mem < res.memory_mib \
                            or any(x.node == node.name for x in workers):
                        continue
                    slots = self._slots(node, res, set())
                    if slots is not None:
                        workers.append(WorkerAssignment(w, node.name, slots))
                        break
                else:
                    break
            if len(workers) == job.spec.workers:
                if self.emit(ev.JobPlaced, self.placer, job_id=job_id, attempt=job.attempt, workers=tuple(workers),
                             policy="first-fit"):
                    self.running.append(job_id)
                if self.rng.random() < 0.01:   # a zombie placer's stale duplicate proposal: rejected
                    self.emit(ev.JobPlaced, "placer-zombie", job_id=job_id, attempt=job.attempt,
                              workers=tuple(workers), policy="first-fit")

    def progress(self) -> None:
        """One step of a random running job: start its workers, checkpoint, finish."""
        if not self.running:
            return
        k = self.rng.randrange(len(self.running))
        job_id = self.running[k]
        job = self.state.jobs[job_id]
        if not job.phase.holds_gpus:
            self.running[k] = self.running[-1]
            self.running.pop()
            return
        agent = self.agents[job.workers[0].node]
        unstarted = [w for w in job.workers if w.worker not in job.started]
        if unstarted:
            w = unstarted[0]
            self.emit(ev.WorkerStarted, self.agents[w.node], job_id=job_id, attempt=job.attempt, worker=w.worker,
                      node=w.node)
            return
        r = self.rng.random()
        if r < 0.25:
            self.emit(ev.CheckpointSaved, agent, job_id=job_id, attempt=job.attempt,
                      checkpoint=f"s3://ckpt/{job_id}/{job.attempt}/{int(self.now)}",
                      progress_s=round(self.now - job.started_at, 3))
            return
        code = 0 if r < 0.93 else self.rng.choice([1, 137])
        for w in job.workers:
            if w.worker not in job.finished and job.phase.holds_gpus:
                self.emit(ev.WorkerFinished, self.agents[w.node], job_id=job_id, attempt=job.attempt,
                          worker=w.worker, node=w.node, exit_code=code, reason="" if code == 0 else "exit")
                if code:
                    break

    def chaos(self) -> None:
        r = self.rng.random()
        if r < 0.4 and self.state.pending:
            job_id = self.rng.choice(list(self.state.pending)[:200])
            self.emit(ev.JobCancelled, self.admission, job_id=job_id, reason="user cancelled")
        elif r < 0.7:
            name = self.rng.choice(self.node_names)
            node = self.state.nodes[name]
            i = self.rng.randrange(8)
            self.emit(ev.GpuHealthChanged, self.agents[name], node=name, gpu_index=i,
                      healthy=not node.gpus[i].healthy, reason="xid 79", xid=79)
        elif r < 0.85:
            name = self.rng.choice(self.node_names)
            if self.emit(ev.NodeLost, "preemptor-1", node=name, reason="heartbeat timeout"):
                self.lost.append(name)
        elif self.lost:
            name = self.lost.pop(0)
            self.agents[name] = f"node-agent-{secrets.token_hex(4)}"
            self.emit(ev.NodeRegistered, self.agents[name], node=self.node_info(name))
        cordoned = [n for n in self.node_names[:64] if self.state.nodes[n].status.value == "cordoned"]
        if cordoned and self.rng.random() < 0.3:
            self.emit(ev.NodeUncordoned, "operator", node=cordoned[0])

    def run(self, total: int, backlog: int = 3000, snapshot_at: int | None = None):
        """Emit exactly ``total`` events; returns the snapshot bytes taken once ``snapshot_at``
        events were emitted (the state at that log offset), if asked."""
        self.limit = total
        try:
            self._run(backlog, snapshot_at)
        except _Full:
            pass
        self.state.offset = len(self.events) - 1
        return self.snap

    def _run(self, backlog: int, snapshot_at: int | None) -> None:
        self.snap = None
        if self.retention_s:
            self.emit(ev.JobRetentionSet, self.admission, job_retention_s=self.retention_s)
        self.register_all()
        while True:
            if len(self.state.pending) < backlog:
                for _ in range(20):
                    self.submit()
            self.place_some(40)
            for _ in range(self.steps):
                self.progress()
            if self.rng.random() < 0.3:
                self.chaos()
            if self.snap is None and snapshot_at is not None and len(self.events) >= snapshot_at:
                self.state.offset = len(self.events) - 1   # one partition of a fresh topic: offset = index
                self.snap = encode_state(capture_state(self.state))


def mix(events: list[ev.Event]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for e in events:
        counts[type(e).__name__] = counts.get(type(e).__name__, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


# --- Kafka plumbing ---------------------------------------------------------------------
async def produce(bootstrap: str, topics: TopicNames, values: list[bytes], partition: int) -> float:
    """All values into one partition, batched (not awaited one by one); returns seconds."""
    producer = AIOKafkaProducer(**client_args(bootstrap), acks=1, linger_ms=20,
                                max_batch_size=1024 * 1024, max_request_size=8 * 1024 * 1024)
    await producer.start()
    t0 = time.perf_counter()
    try:
        key = POOL.encode()
        pending = []
        batch = producer.create_batch()
        for v in values:
            if batch.append(key=key, value=v, timestamp=None) is None:
                pending.append(await producer.send_batch(batch, topics.events, partition=partition))
                batch = producer.create_batch()
                batch.append(key=key, value=v, timestamp=None)
                if len(pending) >= 64:
                    await asyncio.gather(*pending)
                    pending.clear()
        pending.append(await producer.send_batch(batch, topics.events, partition=partition))
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
    return time.perf_counter() - t0


async def full_replay(bootstrap: str, topics: TopicNames, partition: int,
                      parallel: bool) -> tuple[float, float, float, ClusterState]:
    """Wall seconds, this process's CPU and its catch-up readers' CPU to fold the whole
    partition, and the state: with parallel catch-up as the services run it, or in this
    process alone (``parallel_replay_min=0``)."""
    publisher = EventPublisher(bootstrap, topics, PARTITIONS)
    await publisher.start()
    options = FollowerOptions(partitions=(partition,), freeze_state=True,   # as the services run it
                              parallel_replay_min=PARALLEL_REPLAY_MIN if parallel else 0)
    follower = LogFollower(bootstrap, topics, "bench-replay", DeadLetters(publisher, "bench"), options)
    try:
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0, c0 = time.perf_counter(), time.process_time()
        await follower.start()
        await follower.caught_up(timeout=1800)
        secs, cpu = time.perf_counter() - t0, time.process_time() - c0
        await follower.stop()   # the reader has been waited for: its CPU is counted below
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        reader = (after.ru_utime + after.ru_stime) - (children.ru_utime + children.ru_stime)
        return secs, cpu, reader, follower.states[partition]
    finally:
        await follower.stop()
        await publisher.stop()


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


# --- (b) a new replica, in a fresh process ---------------------------------------------
async def resume_child(bootstrap: str, prefix: str, partition: int, use_snapshots: bool, t_spawn: float) -> None:
    """What ``gpusched-placer`` does to get a pool: join the group, get the partition,
    (load its snapshot,) replay the tail. Prints timings as JSON."""
    t_imported = time.time()
    topics = TopicNames(prefix)
    publisher = EventPublisher(bootstrap, topics, PARTITIONS)
    await publisher.start()
    assigned_at: list[float] = []
    folds: list[float] = []
    options = FollowerOptions(group_id=f"{prefix}placer-{secrets.token_hex(3)}", use_snapshots=use_snapshots,
                              freeze_state=True)   # as services/placer/main.py
    follower = LogFollower(bootstrap, topics, "bench-placer", DeadLetters(publisher, "bench"), options,
                           on_event=lambda *a: folds.append(time.time()),
                           on_assigned=lambda parts: assigned_at.append(time.time()))
    begun: list[float] = []
    begin = follower._begin

    async def timed_begin(tps):   # when the assignment arrived, before the snapshot load
        begun.append(time.time())
        await begin(tps)
        begun.append(time.time())
    follower._begin = timed_begin
    t_start = time.time()
    await follower.start()
    while partition not in follower.states or not assigned_at:
        await asyncio.sleep(0.005)
    end = (await follower.end_positions())[partition]
    while follower.states[partition].offset < end:   # what PartitionProposer waits for
        await asyncio.sleep(0.005)
    t_ready = time.time()
    state = follower.states[partition]
    load = follower.snapshot_loads.get(partition)
    print(json.dumps({
        "spawn_to_imported": t_imported - t_spawn, "imported_to_start": t_start - t_imported,
        "start_to_assigned": begun[0] - t_start,
        "snapshot_read": load.read_s if load else 0.0, "snapshot_decode": load.decode_s if load else 0.0,
        "assigned_to_ready": t_ready - begun[0] - (load.read_s + load.decode_s if load else 0.0),
        "total": t_ready - t_spawn, "cpu": time.process_time(),
        "loaded_to_first_fold": (folds[0] - begun[1]) if folds else 0.0,
        "first_to_last_fold": (folds[-1] - folds[0]) if folds else 0.0, "last_fold_to_ready": t_ready - folds[-1] if folds else 0.0,
        "begun_to_loaded": begun[1] - begun[0],
        "offset": state.offset, "digest": digest(state), "snapshot_offset": follower.snapshot_offsets.get(partition, -1),
    }), flush=True)
    await follower.stop()
    await publisher.stop()
    reader = resource.getrusage(resource.RUSAGE_CHILDREN)   # the catch-up reader, waited for by stop()
    print(json.dumps({"reader_cpu": reader.ru_utime + reader.ru_stime}), flush=True)


def resume(bootstrap: str, prefix: str, partition: int, use_snapshots: bool) -> dict:
    t_spawn = time.time()
    out = subprocess.run(
        [sys.executable, __file__, "--bootstrap", str(bootstrap), "--child-resume", prefix, "--partition", str(partition),
         "--t-spawn", repr(t_spawn)] + (["--snapshots"] if use_snapshots else []),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, timeout=1800,
    )
    if out.returncode:
        raise RuntimeError(f"resume child failed:\n{out.stderr[-4000:]}")
    merged: dict = {}
    for line in out.stdout.strip().splitlines():
        if line.startswith("{"):
            merged.update(json.loads(line))
    return merged


# --- main -------------------------------------------------------------------------------
async def main(args: argparse.Namespace) -> None:
    bootstrap = KafkaConnection.from_env(bootstrap=args.bootstrap)   # GPUSCHED_KAFKA_*: a secured broker
    if args.child_resume:
        await resume_child(bootstrap, args.child_resume, args.partition, args.snapshots, args.t_spawn)
        return
    await wait_for_broker(bootstrap, 60)
    cmd = " ".join([".venv/bin/python", "bench/replay_bench.py"] + sys.argv[1:])
    print(f"command: {cmd}\nbroker: {bootstrap}  cpus: {os.cpu_count()}  load at start: {loadavg()}  "
          f"reducer: {native.status}")
    if not args.reuse:   # a kept log carries its own
        print(f"finished-job retention: {args.retention:g}s of log time" + (" (off: every job stays)" if not args.retention
              else f" (the services' default is {DEFAULT_JOB_RETENTION_S:g}s)"))

    prefix = args.reuse or f"bench-replay-{secrets.token_hex(3)}."
    topics = TopicNames(prefix)
    partition = partition_for(POOL, PARTITIONS)
    try:
        if not args.reuse:
            await ensure_topics(bootstrap, topics, PARTITIONS)
            t0 = time.perf_counter()
            sim = PoolSim(args.seed, args.nodes, args.retention)
            snap = sim.run(args.events, snapshot_at=int(args.events * args.snapshot_at))
            snap_offset = decode_state(snap).offset if snap else -1
            t_gen = time.perf_counter() - t0
            st = sim.state
            live = sum(1 for j in st.jobs.values() if j.phase.holds_gpus)
            print(f"generated {len(sim.events):,} events in {t_gen:.1f}s ({sim.accepted:,} accepted); "
                  f"end state: {len(st.nodes):,} nodes, {len(st.jobs):,} jobs ({live:,} holding GPUs, "
                  f"{len(st.pending):,} pending; {st.pruned:,} finished jobs pruned)")
            print("mix: " + ", ".join(f"{k} {v:,}" for k, v in mix(sim.events).items()))
            t0 = time.perf_counter()
            values = [codec.encode(e, POOL) for e in sim.events]
            t_enc = time.perf_counter() - t0
            size = sum(map(len, values))
            t_prod = await produce(bootstrap, topics, values, partition)
            print(f"encoded in {t_enc:.1f}s ({size / len(values):.0f} B/event avg, {size / 2**20:.0f} MiB); "
                  f"produced in {t_prod:.1f}s ({len(values) / t_prod:,.0f} events/s) to {topics.events}[{partition}]")
            expected = digest(st)
            del values, sim.events
            # The end state's snapshot: the cost a placer pays to write one.
            gc.collect()
            t0, c0 = time.perf_counter(), time.process_time()
            captured = capture_state(st)   # as a placer does (gpusched.adapters.snapshots)
            t_cap, c_cap = time.perf_counter() - t0, time.process_time() - c0
            t0, c0 = time.perf_counter(), time.process_time()
            blob = encode_state(captured)
            t_encode, c_encode = time.perf_counter() - t0, time.process_time() - c0
            del captured
            t0, c0 = time.perf_counter(), time.process_time()
            restored = decode_state(blob)   # as a follower restores one (gpusched.adapters.restore)
            t_restore, c_restore = time.perf_counter() - t0, time.process_time() - c0
            assert digest(restored) == expected
            del restored
            gc.collect()
            t0 = time.perf_counter()
            forked, t_fork = await snapshot_bytes_forked(st) if CAN_FORK else (blob, float("nan"))
            t_child = time.perf_counter() - t0 - t_fork
            assert forked == blob
            del forked
            print(f"snapshot of the end state ({len(st.jobs):,} jobs): {len(blob) / 2**20:.1f} MiB; "
                  f"copy on the loop (capture) {t_cap * 1000:.0f} ms wall / {c_cap * 1000:.0f} ms CPU, "
                  f"encode (off the loop) {t_encode * 1000:.0f} / {c_encode * 1000:.0f} ms, "
                  f"restore {t_restore * 1000:.0f} / {c_restore * 1000:.0f} ms; "
                  f"the placer's default, a forked child: loop blocked {t_fork * 1000:.0f} ms (the fork), "
                  f"child {t_child * 1000:.0f} ms")
            del blob, sim
            gc.collect()
            Path(args.digest_file).write_text(expected) if args.digest_file else None
        else:
            expected = Path(args.digest_file).read_text().strip() if args.digest_file else None
            snap = None

        # (a) full replay
        print(f"load before replay: {loadavg()}")
        runs = []
        for _ in range(args.replays if not args.resume_only else 0):
            for parallel in (True, False) if args.serial_too else (True,):
                secs, cpu, reader, state = await full_replay(bootstrap, topics, partition, parallel)
                n = state.offset + 1
                if parallel:
                    runs.append(n / secs)
                ok = expected is None or digest(state) == expected
                how = (f"parallel catch-up (this process {cpu:.2f}s CPU, its reader {reader:.2f}s)" if parallel
                       else f"one process ({cpu:.2f}s CPU)")
                print(f"(a) full replay, {how}: {n:,} events in {secs:.2f}s = {n / secs:,.0f} events/s "
                      f"(digest {'matches the generator' if ok else 'MISMATCH'}; load {loadavg()})")
                del state
            gc.collect()

        # (b) resume, without a snapshot then with one near the end
        before = resume(bootstrap, prefix, partition, use_snapshots=False)
        print(f"(b) new replica, no snapshot: ready in {before['total']:.2f}s from process spawn "
              f"(imports {before['spawn_to_imported']:.2f}s, group join {before['start_to_assigned']:.2f}s, "
              f"replay {before['assigned_to_ready']:.2f}s; process CPU {before['cpu']:.2f}s, its catch-up reader's "
              f"{before['reader_cpu']:.2f}s; load {loadavg()})")
        if snap is not None:
            store = SnapshotStore(bootstrap, topics)
            await store.start()
            try:
                    meta = await store.write(partition, snap, offset=snap_offset)
            finally:
                await store.stop()
            print(f"wrote a snapshot at offset {snap_offset:,} "
                  f"({len(snap) / 2**20:.1f} MiB) to {topics.snapshots}[{meta.partition}]@{meta.offset}")
        after = resume(bootstrap, prefix, partition, use_snapshots=True)
        same = after["digest"] == before["digest"]
        print(f"(b) new replica, snapshot at {after['snapshot_offset']:,}: ready in {after['total']:.2f}s from process "
              f"spawn (imports {after['spawn_to_imported']:.2f}s, group join {after['start_to_assigned']:.2f}s, "
              f"snapshot read {after['snapshot_read']:.2f}s + decode {after['snapshot_decode']:.2f}s, tail "
              f"{after['offset'] - after['snapshot_offset']:,} events {after['assigned_to_ready']:.2f}s (of which waiting for the first "
              f"fetch {after['loaded_to_first_fold']:.2f}s); process CPU "
              f"{after['cpu']:.2f}s; digest {'same' if same else 'DIFFERENT'} as full replay; load {loadavg()})")
    finally:
        if not args.keep and not args.reuse:
            if problem := await delete_topics(bootstrap, topics):
                print(f"could not delete topics: {problem}")
        elif not args.reuse:
            print(f"kept topics with prefix {prefix!r} (--reuse {prefix} to measure again)")


def cli() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:19092"))
    p.add_argument("--events", type=int, default=1_000_000)
    p.add_argument("--nodes", type=int, default=2000)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--retention", type=float, default=DEFAULT_JOB_RETENTION_S,
                   help="finished-job retention in seconds of log time (the log spans ~20,000 s), recorded as the "
                        "log's first event; 0 keeps every job. With --reuse: the kept log's own")
    p.add_argument("--snapshot-at", type=float, default=0.99, help="fraction of the log the snapshot covers")
    p.add_argument("--replays", type=int, default=2, help="full replays to time")
    p.add_argument("--serial-too", action="store_true",
                   help="time each full replay also in one process (parallel catch-up off)")
    p.add_argument("--keep", action="store_true", help="keep the topics")
    p.add_argument("--resume-only", action="store_true", help="with --reuse: only measure (b)")
    p.add_argument("--reuse", default="", help="measure on topics kept by an earlier run (prefix)")
    p.add_argument("--digest-file", default="", help="write/read the expected end-state digest here")
    p.add_argument("--child-resume", default="", help=argparse.SUPPRESS)
    p.add_argument("--partition", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--snapshots", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--t-spawn", type=float, default=0.0, help=argparse.SUPPRESS)
    asyncio.run(main(p.parse_args()))


if __name__ == "__main__":
    cli()
