"""A node host: many simulated nodes in one process (``gpusched node-host``), as KWOK
runs fake kubelets, for benchmarks and for trying a large cluster on one machine.

Each hosted node is a ``NodeAgent`` (``HostedNode``) with the agent's guarantees: it acts
only on placements the log accepted, starts each worker of an attempt once, and reports
every end. What the host shares among its nodes:

- one ``LogFollower`` of the pool's partition: ``on_event`` hands each event to the nodes
  it concerns (the nodes of the job's workers, and those that did something for the job
  earlier), not to all of them, so an event costs the host about what it costs one agent;
- one report topic, ``<prefix>hostreports.<host>``: each record names its node in a
  header, and the relay lets the host speak only for nodes named ``<host>-...``;
- one beats record an interval (``HostBeats`` on ``<prefix>hostbeats.<host>``) carrying
  every node's beat: the preemptor hears each node in it on its own, so a node the host
  stops beating for is declared lost alone, and all of them when the host dies.

Runs are always simulated (``SimulatedRun``: no process, no lease to fence).
"""
from __future__ import annotations

import asyncio
import logging
import struct
import time
from pathlib import Path

from gpusched.adapters.nodes.reports import hosted_node_name, queue_report
from gpusched.adapters.service import every
from gpusched.core import events as ev
from gpusched.core.model import NodeInfo
from gpusched.core.state import ClusterState
from gpusched.v1 import events_pb2
from gpusched_node_agent.agent import Key, NodeAgent, note_in_log

log = logging.getLogger("gpusched.node_host")
# A beats record carries at most this many nodes' beats (about 50 bytes each), well
# under the broker's default 1 MiB record limit.
BEATS_PER_RECORD = 4096
# Wire tags (field number << 3 | wire type) of what a beats record sets each interval:
# HostBeats.beats (3, length-delimited), Heartbeat.time (4, 64-bit) and HostBeats.time (2, 64-bit).
_BEATS_TAG, _BEAT_TIME_TAG, _HOST_TIME_TAG = b"\x1a", b"\x21", b"\x11"
_TIME_FIELD_BYTES = 9   # a time field: its tag and a little-endian double


class HostedNode(NodeAgent):
    """One simulated node of a host: the agent's logic, the host's topics and follower."""

    def __init__(self, host: "NodeHost", info: NodeInfo) -> None:
        super().__init__(info, host.publisher, f"{host.me}/{info.name}", report_topic=host.report_topic,
                         state_dir=Path("/nonexistent"), grace_s=host.grace_s, real_processes=False,
                         in_log=host.in_log)
        self.host = host

    async def _queue_report(self, event):
        return await queue_report(self.publisher, self.report_topic, event, self.info.pool, node=self.name)

    async def beat(self) -> bool:
        """The host beats for all its nodes (``NodeHost.beats``), started before any joins."""
        return True

    def _my_keys(self, states) -> list[Key]:
        # The host's index of the jobs that concern this node, not a scan of every job:
        # with thousands of nodes a scan each would cost nodes x jobs.
        jobs = (self._job(job_id) for job_id in list(self.host.jobs_of.get(self.name, ())))
        return [(job.job_id, job.attempt, w.worker) for job in jobs if job is not None
                for w in self._my_workers(job)]


class _CaughtUp:
    """The host's follower as each node's ``join`` reads it: caught up once for all."""

    def __init__(self, follower) -> None:
        self._follower = follower

    @property
    def states(self) -> dict[int, ClusterState]:
        return self._follower.states

    async def caught_up(self) -> None:
        return None


class NodeHost:
    def __init__(self, name: str, infos: list[NodeInfo], publisher, me: str, *, report_topic: str,
                 beats_topic: str, grace_s: float = 10.0) -> None:
        self.name = name
        self.publisher = publisher
        self.me = me
        self.report_topic = report_topic
        self.beats_topic = beats_topic
        self.grace_s = grace_s
        self.in_log: dict[str, asyncio.Future] = {}
        self.nodes: dict[str, HostedNode] = {}
        self.nodes.update((info.name, HostedNode(self, info)) for info in infos)
        # job id -> hosted nodes that have (or had, this attempt or an earlier one) a worker
        # of it, and the reverse: who must hear of the job's next event.
        self.concerned: dict[str, set[str]] = {}
        self.jobs_of: dict[str, set[str]] = {}
        self.follower = None
        self.beats_sent = 0
        # Each node's beat up to its time, encoded once with the beats field's tag and length
        # (the time's 9 bytes included): a beat differs from the last only in its time, so an
        # interval's records are these bytes joined, each followed by the time (protobuf
        # reads fields in any order), not thousands of messages built and encoded again.
        self._beat_heads = [_BEATS_TAG + _varint(len(body) + _TIME_FIELD_BYTES) + body for body in (
            events_pb2.Heartbeat(node=n.name, pool=n.info.pool, agent_id=n.info.agent_id).SerializeToString()
            for n in self.nodes.values())]

    # --- the shared follower --------------------------------------------------------
    def index(self, states) -> None:
        """Every job of the folded log that holds GPUs on a hosted node (before joining)."""
        for state in states.values():
            for job in state.jobs.values():
                if job.phase.holds_gpus:
                    self._concern(job.job_id, {w.node for w in job.workers if w.node in self.nodes})

    def _concern(self, job_id: str, names: set[str]) -> None:
        if not names:
            return
        self.concerned.setdefault(job_id, set()).update(names)
        for name in names:
            self.jobs_of.setdefault(name, set()).add(job_id)

    def _release(self, job_id: str) -> None:
        for name in self.concerned.pop(job_id, ()):
            jobs = self.jobs_of.get(name)
            if jobs is not None:
                jobs.discard(job_id)

    def on_event(self, partition: int, offset: int, event, outcome, state: ClusterState) -> None:
        note_in_log(self.in_log, event, state)
        if not outcome.accepted:
            return
        lost = self.nodes.get(event.node) if isinstance(event, ev.NodeLost) else None
        if lost is not None and lost.live:
            lost.on_accepted(event, (), state)
        for job_id in outcome.jobs:
            job = state.jobs.get(job_id)
            if job is not None:
                self._concern(job_id, {w.node for w in job.workers if w.node in self.nodes})
            for name in list(self.concerned.get(job_id, ())):
                node = self.nodes[name]
                if node.live:
                    node.on_accepted(event, (job_id,), state)
            if job is None or job.phase.terminal:
                self._release(job_id)

    # --- start-up -------------------------------------------------------------------
    async def join(self, follower, concurrency: int = 256) -> None:
        """Register every node once the follower caught up; ``concurrency`` of them at a
        time (each waits for its registration to come back through the relay)."""
        self.follower = follower
        await follower.caught_up()
        self.index(follower.states)
        shared = _CaughtUp(follower)
        gate = asyncio.Semaphore(concurrency)

        async def join_one(node: HostedNode) -> None:
            async with gate:
                await node.join(shared)
        await asyncio.gather(*(join_one(node) for node in self.nodes.values()))

    # --- liveness -------------------------------------------------------------------
    def beat_records(self, now: float) -> list[bytes]:
        """This interval's beats of every node, ``BEATS_PER_RECORD`` to a record: each
        an encoded ``HostBeats`` whose beats are the nodes' ``Heartbeat`` at ``now``. What
        runs where is in the log; the beats carry liveness only."""
        stamp = struct.pack("<d", now)
        beat_time = _BEAT_TIME_TAG + stamp
        head = events_pb2.HostBeats(host=self.name).SerializeToString() + _HOST_TIME_TAG + stamp
        heads = self._beat_heads
        return [head + beat_time.join(heads[i:i + BEATS_PER_RECORD]) + beat_time
                for i in range(0, len(heads), BEATS_PER_RECORD)]

    async def beat(self) -> bool:
        try:
            for record in self.beat_records(time.time()):
                await self.publisher.send_raw(self.beats_topic, record, key=self.name.encode())
        except Exception:
            log.warning("host heartbeat not sent", exc_info=True)
            return False
        self.beats_sent += 1
        return True

    async def beats(self, interval: float, stop: asyncio.Event) -> None:
        await every(interval, stop, self.beat)

    def running(self) -> int:
        return sum(len(node.running) for node in self.nodes.values())


def _varint(value: int) -> bytes:
    """``value`` as a protobuf varint (a length prefix)."""
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
