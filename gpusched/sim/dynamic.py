"""The dynamic simulator: jobs arrive, wait, run and leave on a virtual clock.

It drives the production code and nothing else: events go through the reducer
(``gpusched.core.reducer.apply``: JobSubmitted, JobPlaced, WorkerStarted,
WorkerFinished) and placements come from ``Scheduler.cycle``, exactly as in the placer
service, only without Kafka. Time is a heap of future events. A scheduling cycle runs
only after something changed (an arrival or a departure), at most once per
``cycle_interval_s`` of virtual time, so replaying months of trace costs what its events
cost, not what its seconds would.

After each cycle the preemptor's policy runs too (``preemption_decisions``, with the
cycle's quota tree and placement), as in the preemptor service: its ``JobPreempted``
events go through the reducer and each victim's workers report finished at once, as its
node agent would after the checkpoint signal, so the job goes back to the queue. The
work since its last checkpoint (every ``spec.checkpoint_interval_s`` of its run; none
when 0) is lost: its record counts the preemption and those seconds times its GPUs, and
its next attempt runs only what was not saved; checkpoints go to the log too
(``CheckpointSaved``), where the preemptor reads them. Its rules are ``PreemptionConfig``'s
unless a config names others (``+min-runtime=S``, ``+growth=F``, ``+max-min-runtime=S``,
``+budget=N``); it also runs when an exempt time ends. The command line runs the
preemptor unless told not to (``--no-preemption``, or a config ending in ``+no-preemption``);
``DynamicSimulator`` runs it with ``preemption=True`` only, so the properties of the
scheduling cycle alone (the aging and starvation bounds, which assume no job is ever
stopped) are checked on the cycle alone.

With ``services`` (``--services N``) inference services run beside the jobs: their
requests follow a diurnal curve, the preemptor's ``autoscale`` action scales them and
their replicas are placed (and preempt) as any job (``gpusched.sim.serving``).

With ``--topology B,R`` the nodes are labelled in blocks of B nodes and racks of R blocks,
the pool's levels are declared (``PoolTopologySet`` at time 0) or left at the default, the
multi-node gangs may ask for a ``TopologyRequest``, and each run counts how often a gang's
placement stayed inside one block and one rack (``gpusched.sim.topology``).

``python -m gpusched.sim.dynamic --help``: compare configurations on a workload; the
configurations' text is read by ``gpusched.sim.dynamic_configs``, the report (table,
JSON/CSV, plots) is ``gpusched.sim.dynamic_report``.
"""
from __future__ import annotations

import heapq
import math
import time
from dataclasses import replace
from pathlib import Path
from typing import Mapping

from gpusched.core import events as ev
from gpusched.core.model import JobPhase
from gpusched.core.reducer import apply
from gpusched.core.state import ClusterState
from gpusched.policies.placement.registry import PLACEMENTS
from gpusched.policies.actions import ScaleVerdict, Situation, autoscale, make_actions, run_actions
from gpusched.policies.autoscaling import ReplicaLoad
from gpusched.policies.memory import CycleMemory
from gpusched.policies.preemption.decisions import Preemption, preemption_events
from gpusched.policies.preemption.victim_rules import PreemptionConfig, reclaim_min_until
from gpusched.policies.supervision import SupervisionConfig
from gpusched.policies.queueing.quota import claims_guarantee
from gpusched.policies.scheduler import Decision, Scheduler, SchedulerConfig
from gpusched.sim.dynamic_configs import parse_config, split_preemption, split_preemption_rules
from gpusched.sim.metrics import FragmentationProbe, JobRecord, PreemptionRecord, Sample, SimResult
from gpusched.sim.serving import ServiceLoads, ServiceTracker, static_split
from gpusched.sim.topology import GangPlacement, domain_paths, multi_node
from gpusched.sim.workload import Workload


class DynamicSimulator:
    def __init__(self, workload: Workload, config: SchedulerConfig, label: str = "",
                 cycle_interval_s: float = 0.0, fragmentation_every_s: float | None = None,
                 preemption: bool = False, preemption_rules: Mapping[str, float] | None = None,
                 services: ServiceLoads | None = None) -> None:
        if services is not None and services.split == "static":
            nodes, services = static_split(workload.nodes, services)
            workload = replace(workload, nodes=nodes)
        self.workload = workload
        # Inference services beside the jobs (``gpusched.sim.serving``): None, none.
        self.serving = ServiceTracker(services) if services is not None and services.services else None
        self._scaling: dict = {}                    # the autoscaler's memory, per service
        self._replicas: set[str] = set()            # replicas not yet ended
        self.scheduler = Scheduler(config)
        # The preemptor sees the cycle's quota tree and scores placements as the placer does;
        # ``preemption_rules``: PreemptionConfig fields other than their defaults.
        self.preemption = replace(PreemptionConfig(
            quotas=config.quotas,
            placement=config.placement if config.placement in PLACEMENTS else "best-fit"),
            **(preemption_rules or {})) if preemption else None
        # The preemptor's actions that judge jobs (nodes never fail here), with what the
        # service keeps between its calls: the candidate victims and the placer's views.
        self._actions = make_actions(("preempt", "defrag"))
        self._preempting = CycleMemory()   # what the preemptor's searches keep between its calls
        # What the placer's cycles keep for the next: every decision is applied at once, so
        # parking changes no decision (policies.queueing.parking).
        self._placing = CycleMemory()
        self.label = label or f"{config.queue}+{config.placement}" + ("+backfill" if config.backfill else "")
        self.cycle_interval_s = cycle_interval_s
        span = workload.arrivals[-1].time - workload.arrivals[0].time if workload.arrivals else 0.0
        self.fragmentation_every_s = fragmentation_every_s if fragmentation_every_s is not None else span / 400
        self.state = ClusterState(ledger_half_life_s=config.half_life_s)   # a setting of the log
        self.teams = tuple(sorted({a.spec.team for a in workload.arrivals} | set(workload.quotas.teams())
                                  | ({s.spec.team for s in self.serving.loads.services} if self.serving else set())))
        self._team_index = {t: i for i, t in enumerate(self.teams)}
        self._waiting = [0] * len(self.teams)       # jobs waiting, per team
        self._waiting_milli = 0                     # GPU milli they ask for
        self._finishes: list[tuple[float, int, str, int]] = []   # (time, seq, job id, attempt)
        self._seq = 0
        self._clock = 0.0
        self._next_arrival = 0
        self._last_cycle = -math.inf
        self._cycled_version = -1                   # state.version the last cycle saw
        self._remaining: dict[str, float] = {}      # job -> run time its next attempt needs
        self._first_start: dict[str, float] = {}    # job -> when its first attempt started
        self._preempted: dict[str, tuple[int, float]] = {}   # job -> (preemptions, GPU-seconds lost)
        self._records: list[PreemptionRecord] = []           # every victim of every preemption
        self._checkpointing: set[str] = set()       # running jobs with a checkpoint interval
        # When running jobs' exempt times end: they may become victims with nothing else
        # happening, so the preemptor runs again then, at most once per cycle_interval_s.
        self._wakes: list[float] = []
        self._quotas = config.quotas
        self._guarantees = any(config.quotas.team_quota(t).guaranteed_milli for t in self.teams)
        # Jobs whose team held less than its guarantee with them when they arrived.
        self._within_guarantee: set[str] = set()
        self._last_preempt = -math.inf
        # With a topology to measure: the multi-node gangs (job -> GPUs asked), whose
        # placements the result records (``gpusched.sim.topology``).
        self._gangs = _multi_node_gangs(workload) if workload.topology else {}
        self._result: SimResult | None = None

    def run(self) -> SimResult:
        started = time.perf_counter()
        wl, state = self.workload, self.state
        for node in wl.nodes:
            self._apply(ev.NodeRegistered(event_id=f"node:{node.name}", node=node))
        for pool, levels in wl.pool_levels:
            self._apply(ev.PoolTopologySet(event_id=f"topology:{pool}", time=0.0, pool=pool, levels=levels))
        if self.serving is not None:
            for s in self.serving.loads.services:
                self._apply(ev.ServiceApplied(event_id=f"service:{s.spec.name}", time=0.0, spec=s.spec))
        capacity = sum(1000 * len(n.gpus) for n in wl.nodes)
        result = SimResult(wl.name, self.label, capacity, self.teams, _entitlements(wl, self.teams, capacity))
        if wl.topology:
            result.topology_levels, result.pool_levels = wl.topology, dict(wl.pool_levels)
            result.domain_paths = domain_paths(wl.nodes, wl.topology)
            result.gangs = set(self._gangs)
        self._result = result
        probe = FragmentationProbe.for_workload(wl)
        next_probe = -math.inf
        while (now := self._next_time()) is not None:
            self._clock = now
            self._arrive(now)
            while self._finishes and self._finishes[0][0] <= now:
                _, _, job_id, attempt = heapq.heappop(self._finishes)
                self._finish(job_id, attempt, now)
            if self.serving is not None:
                self._serve(now)
            woken = bool(self._wakes) and self._wakes[0] <= now
            while self._wakes and self._wakes[0] <= now:
                heapq.heappop(self._wakes)
            if state.version != self._cycled_version and now >= self._last_cycle + self.cycle_interval_s:
                self._cycle(now, result)
            elif woken and state.pending and now >= self._last_preempt + self.cycle_interval_s:
                self._log_checkpoints(now)
                self._preempt(now)
            result.samples.append(self._sample(now))
            if self.serving is not None:
                self.serving.step(now, sum(j.milli for j in state.jobs.values()
                                            if j.phase.holds_gpus and not j.spec.service))
            if now >= next_probe:
                result.fragmentation.append((now, *probe.measure(state)))
                next_probe = now + self.fragmentation_every_s
        result.jobs = [self._record(job_id) for job_id in state.jobs if not state.jobs[job_id].spec.service]
        if self.serving is not None:
            result.services = self.serving.summary()
        result.preempted = self._records
        result.rejected = state.rejected
        result.wall_s = time.perf_counter() - started
        return result

    def _next_time(self) -> float | None:
        times = []
        if self._next_arrival < len(self.workload.arrivals):
            times.append(self.workload.arrivals[self._next_arrival].time)
        if self._finishes:
            times.append(self._finishes[0][0])
        if self.state.version != self._cycled_version:
            times.append(self._last_cycle + self.cycle_interval_s)   # a cycle is owed
        if self._wakes and self.state.pending:
            times.append(max(self._wakes[0], self._last_preempt + self.cycle_interval_s))
        if self.serving is not None and (due := self.serving.next_time()) is not None:
            times.append(due)
        return max(min(times), self._clock) if times else None

    def _arrive(self, now: float) -> None:
        arrivals = self.workload.arrivals
        while self._next_arrival < len(arrivals) and arrivals[self._next_arrival].time <= now:
            a = arrivals[self._next_arrival]
            used = self.state.usage[a.spec.team].gpu_milli if a.spec.team in self.state.usage else 0
            if claims_guarantee(used, a.spec.total_milli, self._quotas.team_quota(a.spec.team).guaranteed_milli):
                self._within_guarantee.add(a.job_id)
            self._apply(ev.JobSubmitted(event_id=f"submit:{a.job_id}", time=now, job_id=a.job_id, spec=a.spec))
            self._waiting[self._team_index[a.spec.team]] += 1
            self._waiting_milli += a.spec.total_milli
            self._next_arrival += 1

    def _cycle(self, now: float, result: SimResult) -> None:
        result.cycles += 1
        if self.preemption is not None:
            self._log_checkpoints(now)
        for d in self.scheduler.cycle(self.state, now, self._placing):
            self._start(d, now)
            job = self.state.jobs[d.job_id]
            if job.spec.service:
                continue   # replicas are not counted among the waiting jobs
            self._waiting[self._team_index[job.team]] -= 1
            self._waiting_milli -= job.milli
            result.backfilled += d.backfilled
        self._last_cycle, self._cycled_version = now, self.state.version
        if self.preemption is not None:
            self._preempt(now)

    def _preempt(self, now: float) -> None:
        """The preemptor's decisions, applied; each victim leaves at once and is requeued
        (its workers' WorkerFinished make the reducer send it back to pending). The state
        changed, so the next cycle (at ``cycle_interval_s``) places the beneficiaries."""
        self._last_preempt = now
        situation = Situation(self.state, now, SupervisionConfig(), lambda _: self.preemption, self._preempting)
        for decision in run_actions(self._actions, situation):
            assert isinstance(decision, Preemption)
            for_job = self.state.jobs[decision.for_job]
            for_class = for_job.spec.priority_class
            for e in preemption_events(self.state, decision, now, producer="sim"):
                victim = self.state.jobs[e.job_id]
                self._records.append(PreemptionRecord(now, decision.reason, victim.spec.priority_class, for_class,
                                                      self._lost_gpu_s(victim, now), victim.preemptions))
                if self.serving is not None and for_job.spec.service and not victim.spec.service:
                    self.serving.victims_for_replicas += 1
                    self.serving.lost_for_replicas_gpu_s += self._lost_gpu_s(victim, now)
                self._charge_preemption(e.job_id, now)
                self._checkpointing.discard(e.job_id)
                self._apply(e)
                for w in victim.workers:
                    self._apply(ev.WorkerFinished(event_id=f"stop:{e.job_id}:{e.attempt}:{w.worker}", time=now,
                                                  job_id=e.job_id, attempt=e.attempt, worker=w.worker,
                                                  node=w.node, exit_code=0))
                if not victim.spec.service:
                    self._waiting[self._team_index[victim.team]] += 1
                    self._waiting_milli += victim.milli

    def _serve(self, now: float) -> None:
        """The services' side of one step: replicas whose start-up ended report ready (as
        their node-agents would), then at each sync the replicas measure their share of the
        requests and the preemptor's ``autoscale`` action scales the services; at the end
        of the service window the services are deleted."""
        serving, state = self.serving, self.state
        assert serving is not None
        for job_id, attempt in serving.due_ready(now):
            job = state.jobs[job_id]
            service = state.services.get(job.spec.service)
            if job.attempt != attempt or job.phase is not JobPhase.RUNNING or service is None \
                    or job_id not in service.replicas:
                continue
            self._apply(ev.ReplicaReadiness(event_id=f"ready:{job_id}:{attempt}", time=now, job_id=job_id,
                                            attempt=attempt, ready=True, address=job.workers[0].node, port=9000))
            serving.ready_count(service.spec.name, now, len(service.ready))
            self._stop_replicas(now)
        if serving.sync_due(now):
            rps = serving.draw(now)
            services = state.services
            serving.record_minute(now, {n: s.desired for n, s in services.items()},
                                  {n: len(s.ready) for n, s in services.items()})
            loads = {job_id: ReplicaLoad(now, per_second=rps[name] / len(s.ready))
                     for name, s in services.items() for job_id in s.ready}
            situation = Situation(state, now, SupervisionConfig(), lambda _: self.preemption or PreemptionConfig(),
                                  self._preempting, loads=loads, scaling=self._scaling)
            for verdict in autoscale(situation):
                assert isinstance(verdict, ScaleVerdict)
                before = services[verdict.service].desired
                self._apply(ev.ServiceScaled(event_id=f"scale:{verdict.service}:{now}", time=now,
                                             service=verdict.service, replicas=verdict.replicas,
                                             reason=verdict.reason))
                serving.scaled_to(verdict.service, now, before, verdict.replicas)
                serving.ready_count(verdict.service, now, len(services[verdict.service].ready))
            self._stop_replicas(now)
        if serving.end_due(now):
            serving.deleted = True
            for name in sorted(state.services):
                self._apply(ev.ServiceDeleted(event_id=f"delete:{name}", time=now, service=name))
            self._stop_replicas(now)

    def _stop_replicas(self, now: float) -> None:
        """Replicas the reducer stopped (scaled down, deleted) end at once, as their
        node-agents report."""
        for service in self.state.services.values():
            self._replicas.update(service.replicas)
        for job_id in sorted(self._replicas):
            job = self.state.jobs[job_id]
            if job.phase is JobPhase.STOPPING:
                for w in job.workers:
                    if w.worker not in job.finished:
                        self._apply(ev.WorkerFinished(event_id=f"stop:{job_id}:{job.attempt}:{w.worker}", time=now,
                                                      job_id=job_id, attempt=job.attempt, worker=w.worker,
                                                      node=w.node, exit_code=0))
            if job.phase.terminal:
                self._replicas.discard(job_id)

    def _log_checkpoints(self, now: float) -> None:
        """Each running job's latest checkpoint (the one ``_charge_preemption`` counts) as a
        ``CheckpointSaved`` at its time: the preemptor ranks victims by what the log says."""
        for job_id in sorted(self._checkpointing):
            job = self.state.jobs[job_id]
            interval = job.spec.checkpoint_interval_s
            saved_at = job.started_at + math.floor((now - job.started_at) / interval) * interval
            if saved_at > max(job.started_at, job.checkpoint_at):
                self._apply(ev.CheckpointSaved(event_id=f"ckpt:{job_id}:{job.attempt}:{saved_at}", time=saved_at,
                                               job_id=job_id, attempt=job.attempt, checkpoint=f"sim://{job_id}",
                                               progress_s=saved_at - job.started_at))

    @staticmethod
    def _saved_s(job, now: float) -> float:
        """Run time of the attempt up to its last checkpoint (one every
        ``checkpoint_interval_s`` of run time, if any)."""
        interval = job.spec.checkpoint_interval_s
        return math.floor((now - job.started_at) / interval) * interval if interval > 0 else 0.0

    def _lost_gpu_s(self, job, now: float) -> float:
        return (now - job.started_at - self._saved_s(job, now)) * job.milli / 1000

    def _charge_preemption(self, job_id: str, now: float) -> None:
        """Count the preemption and the work it loses: what ran since the attempt's last
        checkpoint."""
        job = self.state.jobs[job_id]
        self._remaining[job_id] = self._remaining.get(job_id, job.spec.simulated_duration_s) - self._saved_s(job, now)
        count, lost = self._preempted.get(job_id, (0, 0.0))
        self._preempted[job_id] = (count + 1, lost + self._lost_gpu_s(job, now))

    def _sample(self, now: float) -> Sample:
        usage = self.state.usage
        return Sample(now, sum(u.gpu_milli for u in usage.values()),
                      tuple(usage[t].gpu_milli if t in usage else 0 for t in self.teams),
                      tuple(w > 0 for w in self._waiting), len(self.state.pending), self._waiting_milli)

    def _apply(self, event: ev.Event) -> None:
        outcome = apply(self.state, event)
        if not outcome.accepted:
            # The simulator proposes only what the scheduler just checked: a rejection
            # is a bug in the policies or the reducer, not a race.
            raise RuntimeError(f"{type(event).__name__} rejected: {outcome.reason}")

    def _start(self, d: Decision, now: float) -> None:
        self._apply(ev.JobPlaced(event_id=f"place:{d.job_id}:{d.attempt}", time=now, job_id=d.job_id,
                                 attempt=d.attempt, workers=d.workers, policy=d.policy))
        if d.job_id in self._gangs and self._result is not None:
            nodes = tuple(w.node for w in sorted(d.workers, key=lambda w: w.worker))
            self._result.gang_placements.append(GangPlacement(d.job_id, d.attempt, self._gangs[d.job_id], nodes))
        for w in d.workers:
            self._apply(ev.WorkerStarted(event_id=f"start:{d.job_id}:{d.attempt}:{w.worker}", time=now,
                                         job_id=d.job_id, attempt=d.attempt, worker=w.worker, node=w.node))
        duration = self._remaining.get(d.job_id, self.state.jobs[d.job_id].spec.simulated_duration_s)
        job = self.state.jobs[d.job_id]
        if job.spec.service and self.serving is not None:
            self.serving.started(d.job_id, d.attempt, now)   # it runs until stopped: no end is due
            return
        if job.spec.checkpoint_interval_s > 0:
            self._checkpointing.add(d.job_id)
        if self.preemption is not None:
            heapq.heappush(self._wakes, self.preemption.exempt_until(job))
            if self._guarantees:   # without guarantees nothing is reclaimed
                heapq.heappush(self._wakes, reclaim_min_until(job, self.preemption))
        self._first_start.setdefault(d.job_id, now)
        heapq.heappush(self._finishes, (now + duration, self._seq, d.job_id, d.attempt))
        self._seq += 1

    def _finish(self, job_id: str, attempt: int, now: float) -> None:
        job = self.state.jobs[job_id]
        if job.attempt != attempt or job.phase is not JobPhase.RUNNING:
            return   # the attempt was preempted: its end is no longer due
        self._checkpointing.discard(job_id)
        for w in job.workers:
            self._apply(ev.WorkerFinished(event_id=f"finish:{job_id}:{attempt}:{w.worker}", time=now,
                                          job_id=job_id, attempt=attempt, worker=w.worker, node=w.node,
                                          exit_code=0))

    def _record(self, job_id: str) -> JobRecord:
        """A job's wait is to its first start; a job preempted and not restarted by the end
        of the run counts as never ended (``started_at`` None), as one that never ran."""
        job = self.state.jobs[job_id]
        ran = job.phase is JobPhase.SUCCEEDED
        preemptions, lost_gpu_s = self._preempted.get(job_id, (0, 0.0))
        return JobRecord(job_id, job.team, job.milli, job.spec.workers, job.submitted_at,
                         self._first_start[job_id] if ran else None, job.ended_at if ran else None,
                         preemptions, lost_gpu_s, job.spec.priority_class, job_id in self._within_guarantee)


def _multi_node_gangs(wl: Workload) -> dict[str, float]:
    """The workload's multi-node gangs (``topology.multi_node``): job -> GPUs it asks for."""
    return {a.job_id: a.spec.total_milli / 1000 for a in wl.arrivals if multi_node(a.spec, wl.nodes)}


def _entitlements(wl: Workload, teams: tuple[str, ...], capacity: int) -> tuple[float, ...]:
    """A team's guarantee when the quotas give one, else an equal split of the cluster."""
    guaranteed = [wl.quotas.team_quota(t).guaranteed_milli for t in teams]
    if any(guaranteed):
        return tuple(guaranteed)
    return tuple(capacity / len(teams) for _ in teams)


# --- command line --------------------------------------------------------------------
def build_parser():
    import argparse

    p = argparse.ArgumentParser(prog="python -m gpusched.sim.dynamic", description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", choices=("synthetic", "openb"), default="synthetic")
    p.add_argument("--configs", default="fifo+best-fit,priority+best-fit,fair-share+best-fit+backfill",
                   help="comma-separated defaults[+quotas] or queue+placement[:ARG=VALUE...][+backfill[=MINUTES]]"
                        "[+reserve=MINUTES][+depth=N][+quotas], with the preemptor's rules maybe "
                        "[+min-runtime=S][+growth=F][+max-min-runtime=S][+budget=N][+loss-per-wait=F][+reclaim-min-runtime=S]"
                        "[+reclaim-window=S], each maybe ending in "
                        "+no-preemption (no preemptor runs)")
    p.add_argument("--seed", type=int, default=0, help="synthetic: workload seed")
    p.add_argument("--horizon-h", type=float, default=48.0, help="synthetic: hours of arrivals")
    p.add_argument("--load", type=float, default=1.0, help="synthetic: scale of every team's load")
    p.add_argument("--worker-gpus", type=int, choices=(1, 2, 4, 8), default=8,
                   help="synthetic: GPUs per worker of a gang (jobs larger than this are gangs)")
    p.add_argument("--pods", default="default", choices=("default", "cpu050", "gpushare40", "gpuspec10"),
                   help="openb: which openb_pod_list_<pods>.csv (multigpu20 has no times)")
    p.add_argument("--compress", type=float, default=300.0, help="openb: divide arrival times by this")
    p.add_argument("--node-stride", type=int, default=8, help="openb: keep every n-th node")
    p.add_argument("--cycle-interval", type=float, default=10.0, help="virtual seconds between cycles, at least")
    p.add_argument("--half-life-h", type=float, default=1.0, help="fair share: usage half-life, hours")
    p.add_argument("--aging-h", type=float, default=6.0, help="fair share: wait after which a job goes first")
    p.add_argument("--no-preemption", action="store_true",
                   help="run no preemptor in any configuration (as +no-preemption on each)")
    p.add_argument("--services", type=int, default=0, metavar="N",
                   help="also run N inference services with a diurnal request curve each, autoscaled "
                        "(gpusched.sim.serving); synthetic: deleted at the end of the arrivals")
    p.add_argument("--service-period-h", type=float, default=24.0, help="services: hours of one request cycle")
    p.add_argument("--service-startup-s", type=float, default=60.0, help="services: a replica's running to ready")
    p.add_argument("--service-gpu-milli", type=int, default=1000, help="services: GPU milli of a replica")
    p.add_argument("--service-max-replicas", type=int, default=16, help="services: replicas at most")
    p.add_argument("--service-peak-to-trough", type=float, default=4.0, help="services: peak / trough requests")
    p.add_argument("--split", default="shared",
                   help="services: comma-separated shared (one cluster) and/or static (an inference pool "
                        "sized for every service's max replicas, training on the rest); each config runs "
                        "under each")
    p.add_argument("--topology", metavar="BLOCK_NODES,RACK_BLOCKS",
                   help="label the nodes in blocks and racks (4,4: node i in block i // 4, block b in rack b // 4; "
                        "labels block and rack) and measure how compact the multi-node gangs' placements are "
                        "(gpusched.sim.topology)")
    p.add_argument("--topology-levels", default="declared",
                   help="with --topology, comma-separated: declared (a PoolTopologySet of rack,block at time 0: "
                        "the gang planner sees blocks) and/or default (no levels declared: the default spine,rack, "
                        "the planner sees racks only); each config runs under each")
    p.add_argument("--gang-topology", default="none",
                   help="with --topology, comma-separated: what the multi-node gangs ask for: none, preferred-block "
                        "(the fewest blocks first; needs declared levels) and/or required-rack (one rack or wait; a "
                        "gang no rack can hold asks nothing, or it would wait forever); each config runs under each "
                        "pair of levels and gang request the pool can honour")
    p.add_argument("--out", type=Path, default=Path("results/dynamic"))
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--publish", type=Path, metavar="FOLDER",
                   help="also write the figures to FOLDER/dynamic-<workload>.json and .md (the published figures: "
                        "docs/figures)")
    p.add_argument("--publish-as", metavar="SUFFIX", default="",
                   help="with --publish: add -SUFFIX to the published name, for a second set of configurations "
                        "on the same workload")
    return p


def workload_of(args):
    """The workload the command line names."""
    from gpusched.sim.synthetic import synthetic_workload
    from gpusched.sim.workload import openb_workload

    if args.workload == "synthetic":
        return synthetic_workload(args.seed, args.horizon_h * 3600, args.load, worker_gpus=args.worker_gpus)
    return openb_workload(args.pods, args.compress, args.node_stride)


def figures_name(args, wl: Workload) -> str:
    """The published figures' name of a run: its workload's, its horizon when not 48 h, and
    ``--publish-as``."""
    horizon = f"-h{args.horizon_h:g}" if args.workload == "synthetic" and args.horizon_h != 48.0 else ""
    horizon += f"-svc{args.services}" if getattr(args, "services", 0) else ""
    horizon += "-topology" if getattr(args, "topology", None) else ""
    suffix = f"-{args.publish_as}" if getattr(args, "publish_as", "") else ""
    return f"dynamic-{wl.name}{horizon}{suffix}"


def run_configs(args, wl: Workload, log=None) -> tuple[list[SimResult], list[dict]]:
    """Each configuration of ``args.configs`` run on ``wl``: the results and their summaries."""
    from gpusched.sim.metrics import summarize

    results, summaries = [], []
    for text in args.configs.split(","):
        base, preemption = split_preemption(text)
        base, rules = split_preemption_rules(base)
        _, config = parse_config(base, wl.quotas, args.half_life_h * 3600, args.aging_h * 3600)
        for services in services_of(args, wl):
            for name, run_wl in topologies_of(args, wl):
                label = text if services is None else f"{text}@{services.split}"
                label = label if name is None else f"{label}@{name}"
                result = DynamicSimulator(run_wl, config, label, args.cycle_interval,
                                          preemption=preemption and not args.no_preemption,
                                          preemption_rules=rules, services=services).run()
                results.append(result)
                summaries.append(summarize(result))
                if log is not None:
                    log(f"  {label}: {result.wall_s:.0f} s")
    return results, summaries


def topologies_of(args, wl: Workload) -> list[tuple[str | None, Workload]]:
    """(name, workload) of each run on a topology (``--topology``): every pair of
    ``--topology-levels`` and ``--gang-topology`` whose request the pool's levels have;
    [(None, wl)] without."""
    from gpusched.sim import topology

    if not getattr(args, "topology", None):
        return [(None, wl)]
    try:
        block, rack = topology.parse_topology(args.topology)
    except ValueError as e:
        raise SystemExit(str(e)) from None
    pairs = [(levels, gangs) for levels in args.topology_levels.split(",") for gangs in args.gang_topology.split(",")]
    for levels, gangs in pairs:
        if levels not in topology.POOL_LEVELS or gangs not in topology.GANG_REQUESTS:
            raise SystemExit(f"--topology-levels: {', '.join(topology.POOL_LEVELS)}; --gang-topology: "
                             f"{', '.join(topology.GANG_REQUESTS)}; got {levels!r}, {gangs!r}")
    kept = [(levels, gangs) for levels, gangs in pairs if topology.valid_pair(levels, gangs)]
    if not kept:
        raise SystemExit("--gang-topology: no gang request names a level the pool's levels have")
    return [(topology.topology_name(levels, gangs), topology.with_topology(wl, block, rack, levels, gangs))
            for levels, gangs in kept]


def services_of(args, wl: Workload) -> list:
    """The services each configuration runs with, one per ``--split``; [None] without."""
    from gpusched.sim.serving import diurnal_services

    if not getattr(args, "services", 0):
        return [None]
    end = args.horizon_h * 3600 if args.workload == "synthetic" else wl.arrivals[-1].time
    return [diurnal_services(args.services, args.seed, end, args.service_period_h * 3600, args.service_gpu_milli,
                             max_replicas=args.service_max_replicas, peak_to_trough=args.service_peak_to_trough,
                             startup_s=args.service_startup_s, split=split)
            for split in args.split.split(",")]


def published(summary: dict) -> dict:
    """A summary as published: every figure but the wall time, which the machine decides."""
    return {k: v for k, v in summary.items() if k != "wall_s"}


def published_table(data: dict) -> str:
    """The page of published figures (``figures.publish``'s ``table``): the workload and
    every table of the published summaries, so without the machine's wall time."""
    from gpusched.sim import dynamic_report

    return f"{data['workload']}.\n\n" + "\n\n".join(dynamic_report.tables(data["summaries"]))


def main(argv: list[str] | None = None) -> int:
    import sys

    from gpusched.sim import dynamic_report, figures

    args = build_parser().parse_args(argv)
    wl = workload_of(args)
    print(f"# {wl.name}: {len(wl.arrivals)} jobs; {wl.note}", flush=True)
    results, summaries = run_configs(args, wl, lambda line: print(line, file=sys.stderr, flush=True))
    out = args.out / wl.name
    command = figures.command_line("python -m gpusched.sim.dynamic", argv)
    dynamic_report.write(out, wl.note, command, summaries)
    print("\n\n".join(dynamic_report.tables(summaries)))
    if not args.no_plots:
        last_arrival = wl.arrivals[-1].time
        for path in dynamic_report.plot(out, results, until_s=1.5 * last_arrival):
            print(f"wrote {path}")
    print(f"wrote {out}/summary.json, summary.csv, table.md")
    if args.publish:
        data = {"argv": figures.arguments(argv), "workload": wl.note, "summaries": [published(s) for s in summaries]}
        for path in figures.publish(args.publish, figures_name(args, wl), command, data, published_table(data)):
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
