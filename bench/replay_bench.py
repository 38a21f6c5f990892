"""Benchmark: replaying a pool log, and how fast a new placer replica resumes a pool.

1. Generates a pool log of N events (default 1,000,000) into fresh topics on the broker:
   the pool workload of ``pool_workload.py`` (registrations, submissions, placements,
   starts, checkpoints, ends, retries, cancellations, GPU faults, node loss), every event
   folded through the reducer while generating.
2. (a) Full replay into a fresh ``LogFollower`` as the services run it (a partition
   100,000 records or more behind is rebuilt with a catch-up reader process, see
   ``gpusched.adapters.log.catchup``): events/s, and the CPU of each process. ``--serial-too``
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
from gpusched.adapters.log import codec  # noqa: E402
from gpusched.adapters.log.follower import FollowerOptions, LogFollower  # noqa: E402
from gpusched.adapters.log.publisher import DeadLetters, EventPublisher, partition_for  # noqa: E402
from gpusched.adapters.log.forked_snapshot import CAN_FORK, snapshot_bytes_forked  # noqa: E402
from gpusched.adapters.broker.kafka_admin import TopicNames, delete_topics, ensure_topics, wait_for_broker  # noqa: E402
from gpusched.adapters.broker.kafka_security import KafkaConnection, client_args  # noqa: E402
from gpusched.adapters.log.restore import decode_state  # noqa: E402
from gpusched.adapters.log.snapshots import SnapshotStore, capture_state, encode_state  # noqa: E402
from gpusched.config import DEFAULT_JOB_RETENTION_S, PARALLEL_REPLAY_MIN  # noqa: E402
from gpusched.core.digest import digest  # noqa: E402
from gpusched.core.state import ClusterState  # noqa: E402
from bench.pool_workload import POOL, PoolSim, mix  # noqa: E402

PARTITIONS = 4


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
            captured = capture_state(st)   # as a placer does (gpusched.adapters.log.snapshots)
            t_cap, c_cap = time.perf_counter() - t0, time.process_time() - c0
            t0, c0 = time.perf_counter(), time.process_time()
            blob = encode_state(captured)
            t_encode, c_encode = time.perf_counter() - t0, time.process_time() - c0
            del captured
            t0, c0 = time.perf_counter(), time.process_time()
            restored = decode_state(blob)   # as a follower restores one (gpusched.adapters.log.restore)
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
