"""Parallel catch-up (``gpusched.adapters.log.catchup``): a follower that rebuilds a partition
through a reader process folds exactly what folding the records itself would: the same
state, the same events in the same order to its callback, the same dead letters; then its
consumer carries on from the offset reached, also when the reader dies half-way; a
follower that stops mid-way leaves no reader behind, and neither does a consumer-group
rebalance mid-way, after which the pool's new owner agrees with a plain follower."""
from __future__ import annotations

import asyncio
import os
import time
import uuid
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from gpusched.adapters.log import catchup
from gpusched.adapters.log.follower import FollowerOptions, LogFollower
from gpusched.adapters.log.publisher import DeadLetters, EventPublisher, partition_for
from gpusched.adapters.broker.kafka_security import client_args
from gpusched.core import events as ev
from gpusched.core.digest import digest
from gpusched.core.model import GpuSlot, WorkerAssignment
from gpusched.v1 import events_pb2
from tests.unit.core.builders import make_node, make_spec

POOL, PARTITION = "default", partition_for("default", 4)
NODES, GPUS = 8, 8
BAD = (b"\xff\x00garbage", b"",
       events_pb2.EventEnvelope(event_id="x1", type="JobTeleported", pool=POOL).SerializeToString())


def history(jobs: int, first: int = 0) -> list[ev.Event]:
    """Jobs that run one after another on each GPU: submitted, placed, started, a
    checkpoint for every third, finished (every seventh fails); every eleventh is
    cancelled while pending instead."""
    out: list[ev.Event] = []
    for i in range(first, first + jobs):
        j, t = f"job-{i}", float(i)
        out.append(ev.JobSubmitted(event_id=f"s{i}", time=t, producer="admission", job_id=j,
                                   spec=make_spec(f"team-{i % 3}", name=j)))
        if i % 11 == 0:
            out.append(ev.JobCancelled(event_id=f"c{i}", time=t, producer="admission", job_id=j))
            continue
        node, gpu = f"n{i % NODES}", (i // NODES) % GPUS
        out.append(ev.JobPlaced(event_id=f"p{i}", time=t, producer="placer", job_id=j, attempt=0,
                                workers=(WorkerAssignment(0, node, (GpuSlot(gpu),)),)))
        out.append(ev.WorkerStarted(event_id=f"r{i}", time=t, producer=node, job_id=j, attempt=0, worker=0,
                                    node=node))
        if i % 3 == 0:
            out.append(ev.CheckpointSaved(event_id=f"k{i}", time=t, producer=node, job_id=j, attempt=0,
                                          checkpoint=f"ckpt://{j}", progress_s=1.0))
        out.append(ev.WorkerFinished(event_id=f"f{i}", time=t, producer=node, job_id=j, attempt=0, worker=0,
                                     node=node, exit_code=1 if i % 7 == 0 else 0))
    return out


async def write_log(bootstrap: str, topics, publisher: EventPublisher, jobs: int) -> int:
    """Nodes, then ``jobs`` jobs in three slices with a bad record between slices; the
    number of records written."""
    nodes = [ev.NodeRegistered(event_id=f"n{i}", producer="agent", node=make_node(f"n{i}", gpus=GPUS))
             for i in range(NODES)]
    events = history(jobs)
    cut = len(events) // 3
    slices = [nodes + events[:cut], events[cut:2 * cut], events[2 * cut:]]
    raw = AIOKafkaProducer(**client_args(bootstrap))
    await raw.start()
    try:
        for i, part in enumerate(slices):
            await publisher.publish_all([(e, POOL) for e in part])
            if i < len(BAD):
                await raw.send_and_wait(topics.events, BAD[i], key=POOL.encode(), partition=PARTITION)
    finally:
        await raw.stop()
    return sum(map(len, slices)) + len(BAD)


class Follower:
    """A follower of the pool's partition that notes every event its callback sees."""

    def __init__(self, bootstrap, topics, publisher, parallel_replay_min: int) -> None:
        self.seen: list[tuple[int, str, bool]] = []
        self.name = f"catchup-{parallel_replay_min}-{uuid.uuid4().hex[:6]}"
        options = FollowerOptions(partitions=(PARTITION,), parallel_replay_min=parallel_replay_min)
        self.dead_letters = DeadLetters(publisher, self.name)   # pool-log records: logged, left to the placer
        self.follower = LogFollower(bootstrap, topics, self.name, self.dead_letters, options, on_event=self._note)

    def _note(self, partition, offset, event, outcome, state) -> None:
        self.seen.append((offset, event.event_id, outcome.accepted))

    @property
    def state(self):
        return self.follower.states[PARTITION]

    async def replay(self) -> "Follower":
        await self.follower.start()
        await self.follower.caught_up()
        return self


@pytest.fixture
async def publisher(kafka_bootstrap, topics):
    publisher = EventPublisher(kafka_bootstrap, topics, 4)
    await publisher.start()
    yield publisher
    await publisher.stop()


async def test_a_parallel_catch_up_folds_what_the_consumer_would(kafka_bootstrap, topics, publisher):
    records = await write_log(kafka_bootstrap, topics, publisher, jobs=3500)
    assert records > 3 * catchup.FRAME_EVENTS   # several frames
    plain = await Follower(kafka_bootstrap, topics, publisher, parallel_replay_min=0).replay()
    parallel = await Follower(kafka_bootstrap, topics, publisher, parallel_replay_min=1).replay()
    try:
        run = parallel.follower.catchups.runs[PARTITION]
        assert run["error"] == "" and run["start"] == 0 and run["end"] == records
        assert run["folded"] == records                 # every record came through the reader
        assert PARTITION not in plain.follower.catchups.runs
        assert digest(parallel.state) == digest(plain.state)
        assert parallel.state.offset == plain.state.offset == records - 1
        assert parallel.seen == plain.seen and len(plain.seen) == records - len(BAD)
        # the same records skipped, for the same reasons
        assert list(parallel.dead_letters.skipped) == list(plain.dead_letters.skipped)
        assert len(plain.dead_letters.skipped) == len(BAD)

        # Live: the consumer took over right after the last record the reader folded.
        more = history(40, first=10_000)
        await publisher.publish_all([(e, POOL) for e in more])
        await asyncio.gather(plain.follower.caught_up(), parallel.follower.caught_up())
        assert parallel.seen == plain.seen and len(plain.seen) == records - len(BAD) + len(more)
        assert digest(parallel.state) == digest(plain.state)
    finally:
        await asyncio.gather(plain.follower.stop(), parallel.follower.stop())


async def test_a_reader_that_dies_leaves_the_rest_to_the_consumer(kafka_bootstrap, topics, publisher, monkeypatch):
    records = await write_log(kafka_bootstrap, topics, publisher, jobs=3500)
    real_frames = catchup.frames

    async def one_frame_then_death(*args):
        stream = real_frames(*args)
        try:
            yield await stream.__anext__()
        finally:
            await stream.aclose()   # kills the reader
        raise catchup.CatchUpFailed("reader died (test)")

    monkeypatch.setattr(catchup, "frames", one_frame_then_death)
    plain = await Follower(kafka_bootstrap, topics, publisher, parallel_replay_min=0).replay()
    broken = await Follower(kafka_bootstrap, topics, publisher, parallel_replay_min=1).replay()
    try:
        run = broken.follower.catchups.runs[PARTITION]
        assert "reader died" in run["error"] and run["folded"] == catchup.FRAME_EVENTS
        assert broken.state.offset == records - 1
        assert broken.seen == plain.seen                 # no record twice, none missed
        assert digest(broken.state) == digest(plain.state)
    finally:
        await asyncio.gather(plain.follower.stop(), broken.follower.stop())


def readers() -> set[int]:
    """Pids of this process's live catch-up readers."""
    me, found = os.getpid(), set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[1]) == me and fields[0] != "Z" and b"gpusched.adapters.log.catchup" in cmdline:
            found.add(int(stat.parent.name))
    return found


async def test_a_follower_stopped_mid_catch_up_leaves_no_reader(kafka_bootstrap, topics, publisher):
    await write_log(kafka_bootstrap, topics, publisher, jobs=12_000)   # ~14 frames: the reader cannot run ahead
    first_fold = asyncio.Event()
    follower = LogFollower(kafka_bootstrap, topics, "stopped", DeadLetters(publisher, "stopped"),
                           FollowerOptions(partitions=(PARTITION,), parallel_replay_min=1),
                           on_event=lambda *a: first_fold.set())
    await follower.start()
    try:
        await asyncio.wait_for(first_fold.wait(), 60)
        running = readers()
        assert len(running) == 1                          # mid-stream, blocked on its pipe
        assert follower.lag(PARTITION) is None            # not caught up while the reader works
    finally:
        await follower.stop()
    assert not readers() & running
    assert follower.states[PARTITION].offset < follower.catchups.runs[PARTITION]["end"] - 1


async def test_a_rebalance_mid_catch_up_stops_the_reader_and_the_new_owner_agrees(kafka_bootstrap, topics, publisher):
    records = await write_log(kafka_bootstrap, topics, publisher, jobs=12_000)
    plain = await Follower(kafka_bootstrap, topics, publisher, parallel_replay_min=0).replay()
    await plain.follower.stop()
    group = f"{topics.prefix}catchup-group"
    first_fold, assigned = asyncio.Event(), asyncio.Event()
    slow = [True]   # the first member folds slowly until its partitions are taken, so the
                    # rebalance lands while its catch-up runs (a frame still folds in ~1 s)

    def on_event(*_):
        first_fold.set()
        if slow[0]:
            time.sleep(0.0002)

    def revoked(parts):
        slow[0] = False

    owners: list[LogFollower] = []

    def member(name: str, on_event=None, on_revoked=None) -> LogFollower:
        def on_assigned(parts):
            if PARTITION in parts:
                owners.append(follower)
                assigned.set()
        follower = LogFollower(kafka_bootstrap, topics, name, DeadLetters(publisher, name),
                               FollowerOptions(group_id=group, parallel_replay_min=1),
                               on_event=on_event, on_assigned=on_assigned, on_revoked=on_revoked)
        return follower

    a = member("member-a", on_event=on_event, on_revoked=revoked)
    b = member("member-b")
    await a.start()
    try:
        await asyncio.wait_for(first_fold.wait(), 60)
        first_reader = readers()
        assert len(first_reader) == 1 and a.catchups.running(PARTITION)
        assigned.clear()
        await b.start()                                   # the group rebalances: a loses its partitions
        await asyncio.wait_for(assigned.wait(), 60)       # the pool has an owner again
        owner = owners[-1]
        assert not readers() & first_reader               # the revoked catch-up's reader is gone
        await owner.caught_up()
        assert owner.states[PARTITION].offset == records - 1
        assert digest(owner.states[PARTITION]) == digest(plain.state)
    finally:
        await asyncio.gather(a.stop(), b.stop())
    assert not readers()
