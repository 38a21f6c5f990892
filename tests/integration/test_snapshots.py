"""Snapshots on the real broker: a follower that starts from a snapshot plus the tail of
the log holds the same state as one that replayed everything; a bad snapshot means a
full replay, not a wrong state; a group member that gains a pool starts from its snapshot."""
from __future__ import annotations

import asyncio
import itertools
import random
import uuid

from gpusched.adapters.log import codec
from gpusched.adapters.log.follower import FollowerOptions, LogFollower
from gpusched.adapters.log.publisher import DeadLetters, EventPublisher, partition_for
from gpusched.adapters.log.snapshots import SnapshotStore, SnapshotWriter
from gpusched.core import events as ev
from gpusched.core.digest import digest
from gpusched.core.model import GpuInfo, GpuSlot, JobSpec, NodeInfo, WorkerAssignment, WorkerResources
from gpusched.core.reducer import apply
from gpusched.core.snapshot import snapshot_bytes, state_from_snapshot
from gpusched.core.state import ClusterState
from gpusched.local_cluster import LocalCluster
from tests.integration.logcheck import read_log
from tests.polling import eventually_async

PARTITIONS = 4


def _pools() -> dict[int, str]:
    """One pool name per events partition."""
    found: dict[int, str] = {}
    for i in itertools.count():
        found.setdefault(partition_for(f"pool-{i}", PARTITIONS), f"pool-{i}")
        if len(found) == PARTITIONS:
            return found


POOLS = _pools()


class PoolLog:
    """Valid histories for a few pools: nodes, then jobs submitted, placed, started,
    checkpointed and finished (some failing), with a duplicate and a stale proposal now
    and then. Every event is folded into ``self.states`` as it is made."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.states = {pool: ClusterState() for pool in POOLS.values()}
        self.n = 0

    def _emit(self, pool: str, cls, **kw) -> tuple[ev.Event, str]:
        self.n += 1
        event = cls(event_id=uuid.UUID(int=self.rng.getrandbits(128)).hex, time=1000.0 + self.n, **kw)
        apply(self.states[pool], event)
        return event, pool

    def nodes(self) -> list[tuple[ev.Event, str]]:
        out = []
        for pool in POOLS.values():
            for i in range(3):
                name = f"{pool}-n{i}"
                gpus = tuple(GpuInfo(g, f"GPU-{name}-{g}", "H100-80GB", 81_559, True) for g in range(4))
                out.append(self._emit(pool, ev.NodeRegistered, node=NodeInfo(name, pool, 64_000, 512_000, gpus)))
        return out

    def jobs(self, count: int) -> list[tuple[ev.Event, str]]:
        out = []
        for _ in range(count):
            pool = self.rng.choice(list(POOLS.values()))
            state = self.states[pool]
            job_id = f"job-{self.n}"
            res = self.rng.choice([WorkerResources(gpus=1, cpu_milli=1000), WorkerResources(gpu_milli=250),
                                   WorkerResources(mig_profile="2g")])
            out.append(self._emit(pool, ev.JobSubmitted, job_id=job_id,
                                  spec=JobSpec(job_id, self.rng.choice(["t1", "t2"]), pool=pool, resources=res),
                                  idempotency_key=self.rng.choice(["", f"k{self.n}"])))
            slots = self._free_slot(state, res)
            if slots is None:
                continue   # stays pending: the snapshot must carry a queue too
            node, slot = slots
            workers = (WorkerAssignment(0, node, (slot,)),)
            out.append(self._emit(pool, ev.JobPlaced, job_id=job_id, attempt=0, workers=workers))
            if self.rng.random() < 0.1:   # a zombie placer's late copy: rejected
                out.append(self._emit(pool, ev.JobPlaced, job_id=job_id, attempt=0, workers=workers))
            out.append(self._emit(pool, ev.WorkerStarted, job_id=job_id, attempt=0, worker=0, node=node))
            if self.rng.random() < 0.3:
                out.append(self._emit(pool, ev.CheckpointSaved, job_id=job_id, attempt=0, checkpoint=f"ck/{job_id}",
                                      progress_s=12.5))
            if self.rng.random() < 0.7:   # the rest keep running
                out.append(self._emit(pool, ev.WorkerFinished, job_id=job_id, attempt=0, worker=0, node=node,
                                      exit_code=self.rng.choice([0, 0, 0, 1])))
            if self.rng.random() < 0.05:  # a producer retry: the same event again
                out.append(out[-1])
        return out

    @staticmethod
    def _free_slot(state: ClusterState, res: WorkerResources):
        for name, node in sorted(state.nodes.items()):
            for i, gpu in enumerate(node.gpus):
                if res.gpus and gpu.fits_whole():
                    return name, GpuSlot(i)
                if res.gpu_milli and gpu.fits_share(res.gpu_milli):
                    return name, GpuSlot(i, res.gpu_milli)
                if res.mig_profile and gpu.used_milli == 0:
                    from gpusched.core.mig import PROFILES
                    profile = PROFILES["2g"]
                    for start in profile.starts:
                        if gpu.fits_mig(profile, start):
                            return name, GpuSlot(i, profile.milli, "2g", start)
        return None


async def _publisher(kafka_bootstrap, topics) -> EventPublisher:
    publisher = EventPublisher(kafka_bootstrap, topics, PARTITIONS)
    await publisher.start()
    return publisher


async def _follower(kafka_bootstrap, topics, publisher, snapshots=None, on_event=None, **options) -> LogFollower:
    follower = LogFollower(kafka_bootstrap, topics, f"t-{uuid.uuid4().hex[:6]}", DeadLetters(publisher, "t"),
                           FollowerOptions(**options), on_event=on_event, snapshots=snapshots)
    await follower.start()
    return follower


async def _full_replay_digests(kafka_bootstrap, topics, publisher) -> dict[int, str]:
    follower = await _follower(kafka_bootstrap, topics, publisher)
    try:
        await follower.caught_up(60)
        return {p: digest(s) for p, s in follower.states.items() if s.offset >= 0}
    finally:
        await follower.stop()


async def test_snapshot_plus_tail_is_the_full_replay(kafka_bootstrap, topics):
    log = PoolLog(seed=1)
    publisher = await _publisher(kafka_bootstrap, topics)
    store = SnapshotStore(kafka_bootstrap, topics)
    try:
        await publisher.publish_all(log.nodes() + log.jobs(250))
        first = await _follower(kafka_bootstrap, topics, publisher)
        try:
            await first.caught_up(60)
            for pool, state in log.states.items():   # the follower folds what the generator folded
                assert digest(first.states[partition_for(pool, PARTITIONS)]) == digest(state)
            covered = {}
            for p, state in first.states.items():
                covered[p] = state.offset
                await store.write(p, snapshot_bytes(state), state.offset)
        finally:
            await first.stop()
        await publisher.publish_all(log.jobs(150))          # the tail, after the snapshots

        tail: list[tuple[int, int]] = []
        second = await _follower(kafka_bootstrap, topics, publisher, use_snapshots=True, snapshots=store,
                                 on_event=lambda p, off, e, out, st: tail.append((p, off)))
        try:
            await second.caught_up(60)
            assert second.snapshot_offsets == covered            # every partition started from its snapshot
            assert all(off > covered[p] for p, off in tail)      # and folded only what came after it
            assert {p: digest(s) for p, s in second.states.items() if s.offset >= 0} \
                == await _full_replay_digests(kafka_bootstrap, topics, publisher)
            for pool, state in log.states.items():
                assert digest(second.states[partition_for(pool, PARTITIONS)]) == digest(state)
        finally:
            await second.stop()
    finally:
        await store.stop()
        await publisher.stop()


async def test_a_bad_snapshot_means_a_full_replay(kafka_bootstrap, topics, caplog):
    log = PoolLog(seed=2)
    publisher = await _publisher(kafka_bootstrap, topics)
    store = SnapshotStore(kafka_bootstrap, topics)
    try:
        await publisher.publish_all(log.nodes() + log.jobs(120))
        expected = await _full_replay_digests(kafka_bootstrap, topics, publisher)
        corrupt, future, good = sorted(expected)[:3]
        # corrupt bytes; a valid snapshot of a longer log (not this one); a good snapshot
        # followed by a record of another key in the same snapshots partition
        await store.write(corrupt, b"GSNP\x01not zlib at all", 5)
        ahead = ClusterState()
        ahead.offset = 10_000_000
        await store.write(future, snapshot_bytes(ahead), ahead.offset)
        reference = await _follower(kafka_bootstrap, topics, publisher)
        try:
            await reference.caught_up(60)
            good_offset = reference.states[good].offset
            await store.write(good, snapshot_bytes(reference.states[good]), good_offset)
            await publisher.send_raw(topics.snapshots, b"someone else's", key=b"99", partition=good)
        finally:
            await reference.stop()

        follower = await _follower(kafka_bootstrap, topics, publisher, use_snapshots=True, snapshots=store)
        try:
            await follower.caught_up(60)
            assert follower.snapshot_offsets[corrupt] == -1 and follower.snapshot_offsets[future] == -1
            assert follower.snapshot_offsets[good] == good_offset
            assert {p: digest(s) for p, s in follower.states.items() if s.offset >= 0} == expected
        finally:
            await follower.stop()
        assert "ignoring the snapshot" in caplog.text
    finally:
        await store.stop()
        await publisher.stop()


async def test_the_job_retention_comes_from_the_log_also_through_a_snapshot(kafka_bootstrap, topics):
    """No replica takes its retention from a flag: the log's JobRetentionSet sets it, a
    snapshot carries it, and a replica resuming from that snapshot folds with it."""
    log = PoolLog(seed=4)
    publisher = await _publisher(kafka_bootstrap, topics)
    store = SnapshotStore(kafka_bootstrap, topics)
    try:
        for p in range(PARTITIONS):
            await publisher.publish_to(ev.JobRetentionSet(event_id=uuid.uuid4().hex, time=1.0,
                                                          job_retention_s=3600.0), p)
        await publisher.publish_all(log.nodes() + log.jobs(80))
        reference = await _follower(kafka_bootstrap, topics, publisher)
        try:
            await reference.caught_up(60)
            assert {s.retention_s for s in reference.states.values()} == {3600.0}
            for p, state in reference.states.items():
                await store.write(p, snapshot_bytes(state), state.offset)
            expected = {p: digest(s) for p, s in reference.states.items()}
        finally:
            await reference.stop()
        follower = await _follower(kafka_bootstrap, topics, publisher, use_snapshots=True, snapshots=store)
        try:
            await follower.caught_up(60)
            assert all(follower.snapshot_offsets[p] >= 0 for p in expected)   # resumed, not replayed
            assert {s.retention_s for s in follower.states.values()} == {3600.0}
            assert {p: digest(s) for p, s in follower.states.items()} == expected
        finally:
            await follower.stop()
    finally:
        await store.stop()
        await publisher.stop()


async def test_a_member_that_gains_a_pool_starts_from_its_snapshot(kafka_bootstrap, topics):
    log = PoolLog(seed=3)
    publisher = await _publisher(kafka_bootstrap, topics)
    store_a, store_b = SnapshotStore(kafka_bootstrap, topics, "a"), SnapshotStore(kafka_bootstrap, topics, "b")
    group = f"{topics.prefix}placer"
    a = b = None
    try:
        await publisher.publish_all(log.nodes() + log.jobs(200))
        a = await _follower(kafka_bootstrap, topics, publisher, group_id=group, use_snapshots=True, snapshots=store_a)
        await eventually_async(lambda: len(a.states) == PARTITIONS, "every partition assigned to a", poll=0.05)
        await a.caught_up(60)
        assert set(a.snapshot_offsets.values()) == {-1}        # nothing to start from yet
        writer = SnapshotWriter(a, store_a, every_events=1, every_s=0)
        written = {p: (await writer.maybe_snapshot(p))["offset"] for p in sorted(a.states)}
        assert not any(await asyncio.gather(*(writer.maybe_snapshot(p) for p in a.states)))   # nothing new
        await publisher.publish_all(log.jobs(60))              # a tail after the snapshots

        b = await _follower(kafka_bootstrap, topics, publisher, group_id=group, use_snapshots=True, snapshots=store_b)
        await eventually_async(
            lambda: b.states and len(a.states) + len(b.states) == PARTITIONS and not set(a.states) & set(b.states),
            "the partitions split between a and b", poll=0.05)
        await b.caught_up(60)
        assert b.states and all(b.snapshot_offsets[p] == written[p] for p in b.states)
        expected = await _full_replay_digests(kafka_bootstrap, topics, publisher)
        assert {p: digest(s) for p, s in b.states.items()} == {p: expected[p] for p in b.states}
    finally:
        for f in (a, b):
            if f is not None:
                await f.stop()
        await store_a.stop()
        await store_b.stop()
        await publisher.stop()


async def test_the_placer_writes_snapshots_and_its_successor_starts_from_them(kafka_bootstrap, topics, tmp_path):
    """The real service: ``gpusched-placer`` snapshots its pools, on a schedule and when it
    stops; the next placer starts from the snapshot and goes on scheduling."""
    pool = POOLS[1]
    partition = partition_for(pool, PARTITIONS)
    log = PoolLog(seed=4)
    publisher = await _publisher(kafka_bootstrap, topics)
    store = SnapshotStore(kafka_bootstrap, topics)
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path, partitions=PARTITIONS)

    def submit(n: int) -> list[tuple[ev.Event, str]]:
        out = []
        for _ in range(n):
            log.n += 1
            job_id = f"job-{log.n}"
            out.append((ev.JobSubmitted(event_id=uuid.uuid4().hex, time=2000.0 + log.n, job_id=job_id,
                                        spec=JobSpec(job_id, "t1", pool=pool, resources=WorkerResources(gpu_milli=100))),
                        pool))
        return out

    async def placed(count: int) -> int:
        async def offset():
            records = (await read_log(kafka_bootstrap, topics))[partition]
            n = sum(1 for _, v in records if codec.decode(v)[0].__class__ is ev.JobPlaced)
            return n >= count and (records[-1][0],)   # an offset may be 0: a truthy tuple
        (last,) = await eventually_async(offset, f"{count} jobs placed", 30, poll=0.3)
        return last

    try:
        await publisher.publish_all([e for e in log.nodes() if e[1] == pool] + submit(20))
        first = await cluster.placer("placer-1", "--snapshot-every-events", "1", "--snapshot-every-s", "0")
        await placed(20)
        # written on its schedule: the state of a log prefix, exactly
        record = await eventually_async(lambda: store.read_latest(partition), "a snapshot written", 20, poll=0.3)
        snap = state_from_snapshot(record.value)
        prefix = ClusterState()
        for offset, value in (await read_log(kafka_bootstrap, topics))[partition]:
            if offset <= snap.offset:
                apply(prefix, codec.decode(value)[0])
        assert digest(snap) == digest(prefix) and snap.offset == record.covers

        await first.terminate()                    # a clean stop writes a final snapshot
        end = (await read_log(kafka_bootstrap, topics))[partition][-1][0]
        assert state_from_snapshot((await store.read_latest(partition)).value).offset == end

        await publisher.publish_all(submit(10))
        second = await cluster.placer("placer-2", "--log-level", "INFO")
        await placed(30)                           # the successor schedules the new work
        assert f"partition {partition} from its snapshot at offset {end}" in second.log_path.read_text()
    finally:
        await cluster.stop_all()
        await store.stop()
        await publisher.stop()
