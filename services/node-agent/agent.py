"""The node-agent's behaviour: register, reconcile with the log, run and stop work.

The agent runs the same reducer as every service over its pool's partition, so it acts
only on placements the log accepted, and it stops work as soon as the log no longer
assigns it here (cancelled, failed elsewhere in the gang, node lost). A preempted job is
stopped gracefully: the workload checkpoints within the grace period, the agent reports
the checkpoint, then the worker's end.
"""
from __future__ import annotations

import asyncio
import logging
import tempfile
import time
import uuid
from pathlib import Path

from gpusched.adapters.eventlog import EventPublisher, LogFollower
from gpusched.core import events as ev
from gpusched.core.model import EXIT_LOST, JobPhase, NodeInfo, NodeStatus, WorkerAssignment
from gpusched.core.state import ClusterState, JobState
from gpusched.v1 import events_pb2
from gpusched_node_agent.devices import WorkerDevices
from gpusched_node_agent.runner import ProcessRun, SimulatedRun

log = logging.getLogger("gpusched.node_agent")
Key = tuple[str, int, int]   # (job id, attempt, worker)


class NodeAgent:
    mig = None   # devices.MigManager on a node with dynamic MIG (set by main)

    def __init__(self, info: NodeInfo, publisher: EventPublisher, me: str, grace_s: float = 10.0,
                 workdir: Path | None = None) -> None:
        self.info = info
        self.publisher = publisher
        self.me = me
        self.grace_s = grace_s
        self._workdir = workdir
        self.follower: LogFollower | None = None
        self.live = False                        # replay finished, acting on new events
        self.running: dict[Key, asyncio.Task] = {}
        self.runs: dict[Key, object] = {}
        self.stopping: set[Key] = set()
        self.health: dict[int, str] = {}         # GPU index -> why it is unhealthy

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def workdir(self) -> Path:
        """Where real workloads run; made on first use (simulated nodes never need it)."""
        if self._workdir is None:
            self._workdir = Path(tempfile.mkdtemp(prefix=f"gpusched-{self.info.name}-"))
        return self._workdir

    def _event(self, cls, **fields):
        return cls(event_id=uuid.uuid4().hex, time=time.time(), producer=self.me, **fields)

    async def publish(self, event) -> None:
        """Append, retrying through broker outages: a lost WorkerFinished would leave the
        job holding GPUs forever. The event id stays the same, so a retry that lands
        twice is dropped by the reducer."""
        delay = 0.2
        while True:
            try:
                await self.publisher.publish(event, self.info.pool)
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("publishing %s failed (%s); retrying in %.1fs", type(event).__name__, exc, delay)
                await asyncio.sleep(delay)   # back-off between retries
                delay = min(delay * 2, 5.0)

    # --- start-up -------------------------------------------------------------------
    async def join(self, follower: LogFollower) -> None:
        """Replay, register, then reconcile: work the log gives us that we do not run
        (we just restarted) is reported lost, so the scheduler places it again."""
        self.follower = follower
        await follower.caught_up()
        state = await self._register()
        self.live = True
        for job in list(state.jobs.values()):
            for w in self._my_workers(job):
                if (job.job_id, job.attempt, w.worker) not in self.running:
                    await self._report_lost(job, w, f"not running on {self.name} after agent restart")

    async def _register(self) -> ClusterState:
        pos = await self.publisher.publish(self._event(ev.NodeRegistered, node=self.info), self.info.pool)
        return await self.follower.wait_applied(pos)

    async def _report_lost(self, job: JobState, w: WorkerAssignment, reason: str) -> None:
        await self.publish(self._event(ev.WorkerFinished, job_id=job.job_id, attempt=job.attempt,
                                       worker=w.worker, node=self.name, exit_code=EXIT_LOST, reason=reason))

    def _my_workers(self, job: JobState) -> list[WorkerAssignment]:
        if not job.phase.holds_gpus:
            return []
        return [w for w in job.workers if w.node == self.name and w.worker not in job.finished]

    # --- reacting to the log --------------------------------------------------------
    def on_event(self, partition: int, offset: int, event, outcome, state: ClusterState) -> None:
        if not self.live or not outcome.accepted:
            return
        if isinstance(event, ev.NodeLost) and event.node == self.name:
            # We were declared lost (missed heartbeats) but are alive: our work has been
            # requeued and is stopped below; come back as a fresh, empty node.
            asyncio.create_task(self._register())
        for job_id in outcome.jobs:
            job = state.jobs[job_id]
            if isinstance(event, ev.JobPlaced):
                for w in self._my_workers(job):
                    self._start(job, w)
            if job.phase is JobPhase.PREEMPTING:
                self._stop_for_preemption(job)
            self._stop_stale(job)

    def _start(self, job: JobState, worker: WorkerAssignment) -> None:
        key = (job.job_id, job.attempt, worker.worker)
        if key in self.running:
            return
        spec = job.spec
        report = self._checkpoint_reporter(key) if worker.worker == 0 else None
        if self.info.simulated or not spec.command:
            run = SimulatedRun(spec.simulated_duration_s, job.checkpoint_progress_s, spec.checkpoint_interval_s,
                               report, location=f"sim://{job.job_id}")
        else:
            env = {"GPUSCHED_JOB_ID": job.job_id, "GPUSCHED_ATTEMPT": str(job.attempt),
                   "GPUSCHED_WORKER": str(worker.worker), "GPUSCHED_WORKERS": str(spec.workers)}
            if job.checkpoint:
                env["GPUSCHED_RESUME_FROM"] = job.checkpoint
            devices = WorkerDevices(self.info, worker.gpus, spec.resources, self.info.mps, self.mig)
            run = ProcessRun(spec.command, env, self.workdir / f"{job.job_id}-{job.attempt}-{worker.worker}",
                             report, devices)
        self.runs[key] = run
        self.running[key] = asyncio.create_task(self._run(key, run))

    def _checkpoint_reporter(self, key: Key):
        job_id, attempt, _ = key

        async def report(location: str, progress: float) -> None:
            await self.publish(self._event(ev.CheckpointSaved, job_id=job_id, attempt=attempt,
                                           checkpoint=location, progress_s=progress))
        return report

    async def _run(self, key: Key, run) -> None:
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
            self.stopping.discard(key)

    def _job(self, job_id: str) -> JobState | None:
        for state in self.follower.states.values():
            job = state.jobs.get(job_id)
            if job is not None:
                return job
        return None

    def _still_assigned(self, key: Key) -> bool:
        job = self._job(key[0])
        return (job is not None and job.attempt == key[1] and job.phase.holds_gpus
                and key[2] not in job.finished)

    def _stop_for_preemption(self, job: JobState) -> None:
        for key in [k for k in self.running if k[0] == job.job_id and k[1] == job.attempt]:
            self._stop(key, self.grace_s)

    def _stop_stale(self, job: JobState) -> None:
        for key in [k for k in self.running if k[0] == job.job_id]:
            if not self._still_assigned(key):
                self._stop(key, self.grace_s)

    def _stop(self, key: Key, grace: float) -> None:
        run = self.runs.get(key)
        if run is not None and key not in self.stopping:
            self.stopping.add(key)
            asyncio.create_task(run.stop(grace))

    # --- GPU health -----------------------------------------------------------------
    async def watch_health(self, backend) -> None:
        await backend.start()
        while True:
            fault = await backend.faults.get()
            if not 0 <= fault.gpu_index < len(self.info.gpus):
                log.warning("fault on unknown GPU %s: %s", fault.gpu_index, fault.reason)
                continue
            self.health[fault.gpu_index] = fault.reason
            await self.publish(self._event(ev.GpuHealthChanged, node=self.name, gpu_index=fault.gpu_index,
                                           healthy=False, reason=fault.reason, xid=fault.xid))

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

    def node_status(self) -> NodeStatus | None:
        for state in self.follower.states.values():
            node = state.nodes.get(self.name)
            if node is not None:
                return node.status
        return None
