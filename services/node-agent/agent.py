"""The node-agent's behaviour: register, reconcile with the log, run and stop work.

The agent runs the same reducer as every service over its pool's partition, so it acts
only on placements the log accepted, and it stops work as soon as the log says the
attempt ends (cancelled, preempted, failed elsewhere in the gang, timed out, node lost).
An ending attempt keeps its resources in the log until the agent reports each worker's
real end (docs/guide/workloads.md, "The job lifecycle"): the agent stops the process (SIGTERM,
then SIGKILL after the kill deadline) and reports only once it is gone.

Real workloads run under a shim that kills them when the node's lease runs out, so a
frozen or partitioned agent cannot leave work running past ``lease_s + kill_wait_s``;
the agent renews the lease on every heartbeat the broker acknowledged.
"""
from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import replace
from pathlib import Path

from gpusched.adapters.log.follower import LogFollower
from gpusched.adapters.telemetry import tracing
from gpusched.adapters.log.publisher import EventPublisher
from gpusched.adapters.nodes.reports import confirm, queue_report, queued, report_behind
from gpusched.core import events as ev
from gpusched.core.model import EXIT_LOST, JobPhase, NodeInfo, NodeStatus, WorkerAssignment
from gpusched.core.state import ClusterState, JobState
from gpusched.adapters.nodes.work_view import JOB_KEY, NODE_KEY
from gpusched.ports import free_port
from gpusched_node_agent.devices import WorkerDevices
from gpusched_node_agent.launch_env import node_addresses, service_env, worker_env
from gpusched_node_agent.lease import NodeLease
from gpusched_node_agent.leftovers import end_leftovers, find_leftovers, worker_dir_name
from gpusched_node_agent.liveness import NodeLiveness
from gpusched_node_agent.proc_info import oom_kills
from gpusched_node_agent.readiness import ReadinessWatch, keep_port, kept_port, probe_for
from gpusched_node_agent.runner import (EXIT_NOT_STARTED, STATUS_FILE, LeaseExpired, NotStarted, NothingToRun,
                                        ProcessRun, SimulatedRun, WorkerExit, device_out_of_memory, exit_from_status,
                                        group_alive, killed_unasked, read_status, why_not_started)

log = logging.getLogger("gpusched.node_agent")
Key = tuple[str, int, int]   # (job id, attempt, worker)
_RUNS = (JobPhase.PLACED, JobPhase.RUNNING)
_ENDING = (JobPhase.PREEMPTING, JobPhase.STOPPING)
# How long a registration may take to come back through the relay into the pool log.
RELAY_WAIT_S = 120.0


class RelayTimeout(RuntimeError):
    """The node's registration did not come back into the pool log through the relay."""


class NodeAgent(NodeLiveness):
    mig = None   # devices.MigManager on a node with dynamic MIG (set by main)
    # Whether a process group still runs: how leftovers are judged gone (tests stand in
    # for a process that outlives SIGKILL, which only the kernel can make).
    process_alive = staticmethod(group_alive)

    def __init__(self, info: NodeInfo, publisher: EventPublisher, me: str, *, report_topic: str, state_dir: Path,
                 grace_s: float = 10.0, real_processes: bool = False, in_log: dict | None = None,
                 drain_s: float = 0.0) -> None:
        self.info = info
        self.publisher = publisher
        # Our events go to this node's own topic; the relay appends them to the pool log
        # (gpusched.adapters.nodes.relay). The agent may not write the pool log itself.
        self.report_topic = report_topic
        # event id -> its fold's state, once relayed; a node host shares one among its nodes
        self._in_log: dict[str, asyncio.Future] = {} if in_log is None else in_log
        self.me = me
        self.grace_s = grace_s                   # the kill deadline: SIGTERM, then SIGKILL
        self.drain_s = drain_s                   # a stopped replica serves this long before its SIGTERM
        self.state_dir = Path(state_dir)
        self.real_processes = real_processes     # commands run as processes (NVML, or --run-processes)
        self.lease = NodeLease(self.state_dir / "lease") if info.lease_s > 0 else None
        # What the agent reads: its pool's log (a LogFollower) or its node's work view
        # (work_source.WorkSource); both offer ``states`` and ``caught_up``.
        self.follower: LogFollower | None = None
        self.live = False                        # replay finished, acting on new events
        self.running: dict[Key, asyncio.Task] = {}
        self.runs: dict[Key, object] = {}
        self.stopping: set[Key] = set()
        # What this agent did for each job not yet ended, forgotten when it ends:
        self.launched: set[Key] = set()          # never run the same worker of an attempt twice
        self.ended: set[Key] = set()             # ends reported for workers that never ran
        self.stuck: set[Key] = set()             # leftovers that outlived SIGKILL: never reported ended
        self.rendezvous_offered: set[tuple[str, int]] = set()
        self.checks: dict[Key, asyncio.Task] = {}    # readiness checks of the replicas whose worker 0 runs here
        self.health: dict[int, str] = {}         # GPU index -> why it is unhealthy
        self._returning: asyncio.Task | None = None

    @property
    def name(self) -> str:
        return self.info.name

    def _event(self, cls, **fields):
        return cls(event_id=uuid.uuid4().hex, time=time.time(), producer=self.me, **fields)

    async def publish(self, event) -> None:
        """Report, retrying through broker outages: a lost WorkerFinished would leave the
        job holding GPUs forever. The event id stays the same, so a retry that lands
        twice is dropped by the reducer."""
        delay = 0.2
        while True:
            try:
                await self._send_report(event)
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("publishing %s failed (%s); retrying in %.1fs", type(event).__name__, exc, delay)
                await asyncio.sleep(delay)   # back-off between retries
                delay = min(delay * 2, 5.0)

    async def _send_report(self, event) -> None:
        await (await self._queue_report(event))

    async def _queue_report(self, event) -> asyncio.Future:
        return await queue_report(self.publisher, self.report_topic, event, self.info.pool)

    # --- start-up -------------------------------------------------------------------
    async def join(self, follower) -> None:
        """Take over what an earlier life of this agent left running where the log still
        runs it here, end the rest, register, then report every other worker the log
        still gives us as gone: we do not run it any more, so the scheduler places it
        again (uncharged)."""
        self.follower = follower
        found = await asyncio.to_thread(find_leftovers, self.state_dir, self.process_alive) \
            if self.real_processes else []
        self.settling = bool(found)
        # Workers run on only under a lease that has not run out (a restart shorter than
        # the lease); past it, their shims are fencing them, and none is taken over.
        lease_held = self.lease is not None and self.lease.expiry() > time.time()
        adoptable = lease_held and any(w.adoptable for w in found)
        if adoptable:
            # Keep their lease while the log is read (a heartbeat the broker acknowledged,
            # as always). A node is declared lost only once its lease surely ran out
            # (``supervision.silence_allowed``), so this renewal comes before any NodeLost.
            await self.beat()
        await follower.caught_up()
        await self.beat()                        # a valid lease before anything starts
        rest = [w for w in found if not (adoptable and w.adoptable and self._adopt(w))]
        leftovers = await asyncio.to_thread(end_leftovers, rest, self.grace_s) if rest else []
        self.settling = False
        if self.lease is not None and self.lease.expiry() <= time.time():
            await self.beat()   # it ran out meanwhile: renewed now that nothing of before runs
        ends = {(w.key.job_id, w.key.attempt, w.key.worker): w.end for w in leftovers if w.key is not None}
        # A worker still there after SIGKILL (uninterruptible sleep) still uses its GPUs:
        # its end is never reported, so the log keeps them held, and the node is cordoned.
        stuck = [w.name for w in leftovers if not w.gone]
        self.stuck = {(w.key.job_id, w.key.attempt, w.key.worker) for w in leftovers if not w.gone and w.key}
        await self._register()
        if stuck:
            await self._cordon_for(stuck)
        # Which workers to report is decided now, before any later event is acted on:
        # the states mutate while the reports are sent, and a job placed here meanwhile
        # is started by this agent and reports its own end.
        gone = self._my_keys(list(follower.states.values()))
        self.live = True
        for key in gone:
            end = ends.get(key)
            if end is None and (end := self._recorded_end(key)) is not None and not end.fenced:
                # It ended by itself while no agent watched: its shim recorded the real end
                # (fenced by the lease, it is gone by no fault of its own: reported as such).
                if key not in self.ended and key not in self.launched:
                    self.ended.add(key)
                    await self._finished(key, end)
                continue
            why = f"stopped when the agent on {self.name} restarted" if end else \
                f"not running on {self.name} after agent restart"
            await self._report_gone(key, why, end.signal if end else 0)

    def _recorded_end(self, key: Key) -> WorkerExit | None:
        """The end a worker's shim recorded in its folder, if it ran here and ended."""
        if not self.real_processes:
            return None
        status = read_status(self.state_dir / worker_dir_name(*key) / STATUS_FILE)
        return exit_from_status(status) if status is not None and "ended_at" in status else None

    def _adopt(self, leftover) -> bool:
        """Take over a worker an earlier life of this agent started, when the log still
        runs that very attempt's worker on this node (not lost, not ending): its run
        goes on as if this agent had started it. False: it is ended instead."""
        key = leftover.key
        job = self._job(key.job_id)
        if job is None or job.attempt != key.attempt or job.phase not in _RUNS or self.node_status() is NodeStatus.LOST:
            return False
        worker = next((w for w in self._my_workers(job) if w.worker == key.worker), None)
        if worker is None or (self.mig is not None and any(s.mig_profile for s in worker.gpus)):
            return False   # dynamic MIG: the instances it made for the worker died with that life
        run = self._new_run(job, worker, key, {}, env=False)
        if not run.adopt(leftover.status):
            return False
        key = (key.job_id, key.attempt, key.worker)
        log.info("adopted worker %s of %s (attempt %s), left running by an earlier agent", key[2], key[0], key[1])
        self.launched.add(key)
        self.runs[key] = run
        self.running[key] = asyncio.create_task(self._run(key, run, adopted=True))
        return True

    async def _register(self) -> None:
        """Report the node and wait until the relay put it in the pool log and the fold
        (or the work view) applied it, found by its event id: what follows sees the node
        registered."""
        event = self._event(ev.NodeRegistered, node=self.info)
        in_log = self._in_log[event.event_id] = asyncio.get_running_loop().create_future()
        try:
            await self.publish(event)
            await asyncio.wait_for(in_log, RELAY_WAIT_S)
        except asyncio.TimeoutError:
            raise RelayTimeout(f"the registration of {self.name} did not reach the pool log within "
                               f"{RELAY_WAIT_S:g}s: is a relay running (gpusched-admission, or gpusched relay)?"
                               ) from None
        finally:
            self._in_log.pop(event.event_id, None)

    async def _cordon_for(self, stuck: list[str]) -> None:
        """Cordon this node for workers that outlived SIGKILL: nothing new is placed on a
        node whose GPUs such a process may still use (docs/guide/workloads.md)."""
        names = ", ".join(stuck[:8]) + (f" and {len(stuck) - 8} more" if len(stuck) > 8 else "")
        reason = (f"worker(s) {names} still running after SIGKILL (a process in uninterruptible sleep?): "
                  "their GPUs stay held; once they are gone, restart the agent and uncordon the node")
        log.error("cordoning %s: %s", self.name, reason)
        await self.publish(self._event(ev.NodeCordoned, node=self.name, reason=reason))

    async def _report_gone(self, key: Key, reason: str, signal: int = 0) -> None:
        """A worker of ours that is not (or no longer) running, ended by infrastructure.
        Never one this agent launched: its run reports its real end (``_finished``); nor
        one still there after SIGKILL (``stuck``): its GPUs are still in use."""
        if key in self.ended or key in self.launched or key in self.stuck:
            return
        self.ended.add(key)
        job_id, attempt, worker = key
        await self.publish(self._event(ev.WorkerFinished, job_id=job_id, attempt=attempt, worker=worker,
                                       node=self.name, exit_code=EXIT_LOST, signal=signal, reason=reason))

    def _my_keys(self, states) -> list[Key]:
        """Every worker the log now gives this node, as (job, attempt, worker)."""
        return [(job.job_id, job.attempt, w.worker) for state in states for job in state.jobs.values()
                for w in self._my_workers(job)]

    def _my_workers(self, job: JobState) -> list[WorkerAssignment]:
        if not job.phase.holds_gpus:
            return []
        return [w for w in job.workers if w.node == self.name and w.worker not in job.finished]

    # --- reacting to the log --------------------------------------------------------
    def on_event(self, partition: int, offset: int, event, outcome, state: ClusterState) -> None:
        note_in_log(self._in_log, event, state)
        if self.live and outcome.accepted:
            self.on_accepted(event, outcome.jobs, state)

    def on_accepted(self, event, job_ids, state: ClusterState) -> None:
        """React to an event the log accepted, about ``job_ids`` (a node host hands each
        of its nodes only the jobs that concern it)."""
        if isinstance(event, ev.NodeLost) and event.node == self.name and self._returning is None:
            # Declared lost while alive (a partition, a pause): our work is being placed
            # elsewhere. Stop all of it, report it gone, then come back as an empty node.
            self._returning = asyncio.create_task(self._come_back())
        starts = isinstance(event, (ev.JobPlaced, ev.RendezvousSet))
        for job_id in job_ids:
            job = state.jobs.get(job_id)
            if job is not None:
                self._reconcile(job, node_addresses(job, state.nodes), starts)

    def on_view(self, key: str, doc: dict) -> None:
        """A new record of this node's work view (``--source view``): the same reactions
        as to the log's events, on what the view says changed."""
        if key == NODE_KEY:
            waiting = self._in_log.get(doc.get("registered", ""))
            if waiting is not None and not waiting.done():
                waiting.set_result(None)
            if self.live and doc.get("lost") and self._returning is None:
                self._returning = asyncio.create_task(self._come_back())
            return
        if not self.live:
            return
        job_id = key[len(JOB_KEY):]
        if doc.get("trace"):
            tracing.JOBS.note(job_id, doc["trace"])   # the worker spans join the job's trace
        job = self._job(job_id)
        if job is None:   # no work of this job here any more
            self._stop_stale(job_id)
            self._forget(job_id)
        else:
            self._reconcile(job, self.follower.view.addresses.get(job_id, {}), bool(doc.get("starts")))

    def _reconcile(self, job: JobState, addresses: dict[str, str], starts: bool) -> None:
        if job.phase in _RUNS and starts:
            for w in self._my_workers(job):
                self._start(job, w, addresses)
        elif job.phase in _ENDING:
            for w in self._my_workers(job):
                key = (job.job_id, job.attempt, w.worker)
                if key in self.runs:
                    self._stop(key)
                elif key not in self.launched:
                    asyncio.create_task(self._report_gone(key, "stopped before it started"))
        self._stop_stale(job.job_id)
        if job.phase.terminal:
            self._forget(job.job_id)

    def _forget(self, job_id: str) -> None:
        """An ended job needs no memory here: the sets stay as small as the work in
        flight on this node, and a scan of them per ended job is as cheap."""
        self.launched = {k for k in self.launched if k[0] != job_id}
        self.ended = {k for k in self.ended if k[0] != job_id}
        self.rendezvous_offered = {k for k in self.rendezvous_offered if k[0] != job_id}

    def _start(self, job: JobState, worker: WorkerAssignment, addresses: dict[str, str]) -> None:
        key = (job.job_id, job.attempt, worker.worker)
        if key in self.launched or key in self.ended or key in self.stuck or self._returning is not None:
            return
        if job.spec.workers > 1 and not job.rendezvous:
            # A gang's workers meet at a port on worker 0's node, published in the log
            # first; every worker starts when that event is folded (its outcome names the job).
            if worker.worker == 0 and (job.job_id, job.attempt) not in self.rendezvous_offered:
                self.rendezvous_offered.add((job.job_id, job.attempt))
                asyncio.create_task(self._offer_rendezvous(job))
            return
        self.launched.add(key)
        try:
            run = self._new_run(job, worker, key, addresses)
        except Exception as exc:   # nothing started: its end is reported all the same
            self.running[key] = asyncio.create_task(self._run(key, NotStarted(exc)))
            return
        self.runs[key] = run
        self.running[key] = asyncio.create_task(self._run(key, run))

    def _new_run(self, job: JobState, worker: WorkerAssignment, key: Key, addresses: dict[str, str],
                 env: bool = True):
        """The worker's run: its command as a process under its shim on a node that runs
        processes, else a simulated run. ``env=False``: for a run to adopt, which starts
        nothing (no environment built, no port bound)."""
        spec = job.spec
        report = self._checkpoint_reporter(key) if worker.worker == 0 else None
        if not self.real_processes:
            # nothing reads a worker environment here: no env built, no rendezvous port bound
            return SimulatedRun(spec.simulated_duration_s, job.checkpoint_progress_s, spec.checkpoint_interval_s,
                                report, location=f"sim://{job.job_id}")
        if not spec.command:
            raise NothingToRun(f"spec.command is empty, and {self.name} runs jobs as real processes: "
                               "the job would run nothing")
        devices = WorkerDevices(self.info, worker.gpus, spec.resources, self.info.mps, self.mig)
        return ProcessRun(spec.command, self._worker_env(job, worker, addresses) if env else {},
                          self.state_dir / worker_dir_name(*key), report, devices=devices,
                          lease_path=self.lease.path if self.lease else None, kill_wait=self.grace_s)

    def _worker_env(self, job: JobState, worker: WorkerAssignment, addresses: dict[str, str]) -> dict[str, str]:
        """A real worker's environment (``launch_env``); a single worker's rendezvous is a
        port free on this node now."""
        rendezvous = job.rendezvous or f"{self._address()}:{free_port('')}"
        env = worker_env(job, worker.worker, addresses, rendezvous)
        port = 0
        if job.spec.serve_port:   # kept in its folder: an agent that adopts it checks the same port
            port = free_port("")
            keep_port(self.state_dir / worker_dir_name(job.job_id, job.attempt, worker.worker), port)
        env.update(service_env(job, port))
        if job.checkpoint:
            env["GPUSCHED_RESUME_FROM"] = job.checkpoint
        return env

    async def _offer_rendezvous(self, job: JobState) -> None:
        await self.publish(self._event(ev.RendezvousSet, job_id=job.job_id, attempt=job.attempt, node=self.name,
                                       address=self._address(), port=free_port("")))

    def _address(self) -> str:
        return self.info.address or "127.0.0.1"

    def _checkpoint_reporter(self, key: Key):
        job_id, attempt, _ = key

        async def report(location: str, progress: float) -> None:
            await self.publish(self._event(ev.CheckpointSaved, job_id=job_id, attempt=attempt,
                                           checkpoint=location, progress_s=progress))
        return report

    async def _run(self, key: Key, run, adopted: bool = False) -> None:
        """Start the worker (an ``adopted`` one runs already), report its start unless the
        log has it, then its end."""
        job_id, attempt, worker = key
        oom_before = None if adopted else oom_kills()
        try:
            if not adopted:
                try:
                    if isinstance(run, ProcessRun):
                        await self.lease_held(lambda: key in self.stopping)
                    await run.start()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:   # whatever it was, the worker is not running: its end frees its resources
                    log.warning("worker %s of %s cannot start: %s", worker, job_id, why_not_started(exc))
                    # the node's lease ran out meanwhile: no fault of the job's, placed again uncharged
                    code = EXIT_LOST if isinstance(exc, LeaseExpired) else EXIT_NOT_STARTED
                    await self._finished(key, WorkerExit(code, reason=f"cannot start: {why_not_started(exc)}"))
                    return
                tracing.mark("worker start", job_id, **{"gpusched.node": self.name, "gpusched.worker": worker})
            job = self._job(job_id)
            if adopted and job is not None and worker in job.started:
                self._check_readiness(key, job, known=None)
                end = await run.wait()
                self._end_check(key)
                await self._finished(key, end)
                return
            started = self._event(ev.WorkerStarted, job_id=job_id, attempt=attempt, worker=worker, node=self.name)
            first = await queued(self._queue_report, started)   # the end is awaited meanwhile
            confirmed = asyncio.ensure_future(confirm(self.publish, started, first))
            if job is not None:
                self._check_readiness(key, job, known=None if adopted else False)
            end = await run.wait()
            self._end_check(key)
            end, oom = self._out_of_memory(key, run, end, oom_before)
            await self._finished(key, end, (first, confirmed), oom_killed=oom)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("worker %s failed to run", key)
        finally:
            self._end_check(key)
            self.running.pop(key, None)
            self.runs.pop(key, None)
            self.stopping.discard(key)

    def _check_readiness(self, key: Key, job: JobState, known: bool | None) -> None:
        """Check a service replica's readiness while its worker 0 runs here, reporting
        each change (``readiness``); ``known``: what the log is taken to say now. A
        simulated worker serves nothing to check: it is ready once started."""
        job_id, attempt, worker = key
        if worker != 0 or not job.spec.service or job.attempt != attempt:
            return
        port = kept_port(self.state_dir / worker_dir_name(*key)) if self.real_processes else 0
        probe = probe_for(job.spec.readiness, port, service_env(job, port)) if self.real_processes else None
        address = self._address()

        async def report(ready: bool, reason: str) -> None:
            log.info("replica %s (attempt %s) %s: %s", job_id, attempt, "ready" if ready else "not ready", reason)
            await self.publish(self._event(ev.ReplicaReadiness, job_id=job_id, attempt=attempt, ready=ready,
                                           address=address, port=port, reason=reason))
        self._end_check(key)
        self.checks[key] = asyncio.create_task(ReadinessWatch(job.spec.readiness, probe, report, known).run())

    def _end_check(self, key: Key) -> None:
        """Stop checking: the worker ended or is being stopped (a stopped replica leaves
        the ready set by the log's own rule: no report needed)."""
        task = self.checks.pop(key, None)
        if task is not None:
            task.cancel()

    def _out_of_memory(self, key: Key, run, end: WorkerExit, oom_before: int | None) -> tuple[WorkerExit, bool]:
        """The worker's end, and whether it ran out of memory (docs/guide/workloads.md,
        "Retries by cause"): killed by nobody the agent knows of while the kernel's OOM
        count rose (the host's OOM killer), or failing after its output said a GPU
        allocation failed (CUDA out of memory; the words join the end's reason)."""
        if key in self.stopping or end.exit_code == 0 or end.fenced:
            return end, False
        if oom_before is not None and killed_unasked(end) and (oom_kills() or 0) > oom_before:
            return end, True
        words = device_out_of_memory(run.output_file) if isinstance(run, ProcessRun) else ""
        if not words:
            return end, False
        said = end.reason or f"exited {end.exit_code}"
        return replace(end, reason=f"{said}; its output says {words!r}"), True

    async def _finished(self, key: Key, end: WorkerExit, after: tuple | None = None, oom_killed: bool = False) -> None:
        """Report the worker's real end: only now may the log release its resources.
        ``after``: its start's report (``report_behind``), which goes first."""
        if self._still_assigned(key):
            job_id, attempt, worker = key
            tracing.mark("worker end", job_id, **{"gpusched.node": self.name, "gpusched.worker": worker,
                                                  "gpusched.exit_code": end.exit_code})
            finished = self._event(ev.WorkerFinished, job_id=job_id, attempt=attempt, worker=worker,
                                   node=self.name, exit_code=end.exit_code, signal=end.signal, reason=end.reason,
                                   oom_killed=oom_killed)
            await (report_behind(self._queue_report, self.publish, finished, *after) if after
                   else self.publish(finished))

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

    def _stop_stale(self, job_id: str) -> None:
        for key in [k for k in self.running if k[0] == job_id]:
            if not self._still_assigned(key):
                self._stop(key)

    def _stop(self, key: Key, drain: bool = True) -> None:
        """Stop a worker; a service replica's after ``drain_s`` (its endpoint is gone from
        the log already: load balancers drop it meanwhile, and requests they still send
        are served), unless the node itself is going (``drain`` False)."""
        run = self.runs.get(key)
        if run is not None and key not in self.stopping:
            self.stopping.add(key)
            self._end_check(key)
            job = self._job(key[0])
            delay = self.drain_s if drain and job is not None and job.spec.serve_port else 0.0
            asyncio.create_task(self._stop_run(run, delay))
            self.lease_changed.set()   # one waiting for a valid lease goes on, to its stop

    async def _stop_run(self, run, delay: float) -> None:
        if delay > 0:
            await asyncio.sleep(delay)
        await run.stop(self.grace_s)

    async def _come_back(self) -> None:
        """Declared lost while alive: revoke the lease (every shim fences its workload at
        its next look, and ``beat`` renews it only once nothing runs), stop everything,
        report it gone, and register again as an empty node."""
        if self.lease is not None:
            self.lease.revoke()
        try:
            for key in list(self.runs):
                self._stop(key, drain=False)
            await asyncio.gather(*list(self.running.values()), return_exceptions=True)
            for key in self._my_keys(list(self.follower.states.values())):
                await self._report_gone(key, f"{self.name} was declared lost")
            await self._register()
        finally:
            self._returning = None


def note_in_log(in_log: dict[str, asyncio.Future], event, state: ClusterState) -> None:
    """Wake whoever waits for ``event`` (by its id) to be folded from the pool log."""
    waiting = in_log.get(event.event_id) if in_log else None
    if waiting is not None and not waiting.done():
        waiting.set_result(state)
