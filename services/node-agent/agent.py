"""The node-agent's behaviour: register, reconcile with the log, run and stop work.

The agent runs the same reducer as every service over its pool's partition, so it acts
only on placements the log accepted, and it stops work as soon as the log no longer
assigns it here (cancelled, failed elsewhere in the gang, node lost, preempted).
"""
from __future__ import annotations

import asyncio
import logging
import time
import uuid

from gpusched.adapters.eventlog import EventPublisher, LogFollower
from gpusched.core import events as ev
from gpusched.core.model import EXIT_LOST, NodeInfo
from gpusched.core.state import ClusterState, JobState
from gpusched.v1 import events_pb2
from gpusched_node_agent.runner import ProcessRun, SimulatedRun

log = logging.getLogger("gpusched.node_agent")
STOP_GRACE_S = 10.0


class NodeAgent:
    def __init__(self, info: NodeInfo, publisher: EventPublisher, me: str) -> None:
        self.info = info
        self.publisher = publisher
        self.me = me
        self.follower: LogFollower | None = None
        self.live = False                       # replay finished, acting on new events
        self.running: dict[tuple[str, int, int], asyncio.Task] = {}   # (job, attempt, worker)
        self.runs: dict[tuple[str, int, int], object] = {}

    @property
    def name(self) -> str:
        return self.info.name

    def _event(self, cls, **fields):
        return cls(event_id=uuid.uuid4().hex, time=time.time(), producer=self.me, **fields)

    async def publish(self, event) -> None:
        await self.publisher.publish(event, self.info.pool)

    # --- start-up -------------------------------------------------------------------
    async def join(self, follower: LogFollower) -> None:
        """Replay, register, then reconcile: work the log gives us that we do not run
        (we just restarted) is reported lost, so the scheduler places it again."""
        self.follower = follower
        await follower.caught_up()
        pos = await self.publisher.publish(self._event(ev.NodeRegistered, node=self.info), self.info.pool)
        state = await follower.wait_applied(pos)
        self.live = True
        for job in list(state.jobs.values()):
            for w in self._my_workers(job):
                key = (job.job_id, job.attempt, w.worker)
                if key not in self.running:
                    await self.publish(self._event(ev.WorkerFinished, job_id=job.job_id, attempt=job.attempt,
                                                   worker=w.worker, node=self.name, exit_code=EXIT_LOST,
                                                   reason=f"not running on {self.name} after agent restart"))

    def _my_workers(self, job: JobState):
        if not job.phase.holds_gpus:
            return []
        return [w for w in job.workers if w.node == self.name and w.worker not in job.finished]

    # --- reacting to the log --------------------------------------------------------
    def on_event(self, partition: int, offset: int, event, outcome, state: ClusterState) -> None:
        if not self.live or not outcome.accepted:
            return
        for job_id in outcome.jobs:
            job = state.jobs[job_id]
            if isinstance(event, ev.JobPlaced):
                for w in self._my_workers(job):
                    self._start(job, w)
            self._stop_stale(job)

    def _start(self, job: JobState, worker) -> None:
        key = (job.job_id, job.attempt, worker.worker)
        if key in self.running:
            return
        spec = job.spec
        if self.info.simulated or not spec.command:
            run = SimulatedRun(spec.simulated_duration_s)
        else:
            env = {"GPUSCHED_JOB_ID": job.job_id, "GPUSCHED_ATTEMPT": str(job.attempt),
                   "GPUSCHED_WORKER": str(worker.worker), "GPUSCHED_WORKERS": str(spec.workers)}
            if job.checkpoint:
                env["GPUSCHED_RESUME_FROM"] = job.checkpoint
            run = ProcessRun(spec.command, worker.gpus, [g.uuid for g in self.info.gpus], env)
        self.runs[key] = run
        self.running[key] = asyncio.create_task(self._run(key, run))

    async def _run(self, key, run) -> None:
        job_id, attempt, worker = key
        try:
            try:
                await run.start()
            except OSError as exc:
                await self.publish(self._event(ev.WorkerFinished, job_id=job_id, attempt=attempt, worker=worker,
                                               node=self.name, exit_code=127, reason=f"cannot start: {exc}"))
                return
            await self.publish(self._event(ev.WorkerStarted, job_id=job_id, attempt=attempt,
                                           worker=worker, node=self.name))
            code = await run.wait()
            if self._still_assigned(key):
                await self.publish(self._event(ev.WorkerFinished, job_id=job_id, attempt=attempt,
                                               worker=worker, node=self.name, exit_code=code))
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("worker %s failed to run", key)
        finally:
            self.running.pop(key, None)
            self.runs.pop(key, None)

    def _still_assigned(self, key) -> bool:
        job_id, attempt, worker = key
        for state in self.follower.states.values():
            job = state.jobs.get(job_id)
            if job is not None:
                return job.attempt == attempt and job.phase.holds_gpus and worker not in job.finished
        return False

    def _stop_stale(self, job: JobState) -> None:
        for key in [k for k in self.running if k[0] == job.job_id]:
            if not self._still_assigned(key):
                run = self.runs.get(key)
                if run is not None:
                    asyncio.create_task(run.stop(STOP_GRACE_S))

    # --- liveness -------------------------------------------------------------------
    async def heartbeats(self, interval: float, stop: asyncio.Event) -> None:
        topic = self.publisher.topics.heartbeats
        while not stop.is_set():
            beat = events_pb2.Heartbeat(node=self.name, pool=self.info.pool, agent_id=self.info.agent_id,
                                        time=time.time(), running=[f"{j}/{a}/{w}" for j, a, w in self.running])
            try:
                await self.publisher.send_raw(topic, beat.SerializeToString(), key=self.name.encode())
            except Exception:
                log.warning("heartbeat not sent", exc_info=True)
            try:
                await asyncio.wait_for(stop.wait(), interval)
            except asyncio.TimeoutError:
                pass
