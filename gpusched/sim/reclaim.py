"""Borrow and reclaim between teams: does preemption settle?

A randomised workload on the production code only: jobs of 1, 2 and 4 GPUs from two or
three teams with equal guarantees go through the reducer (``gpusched.core.reducer.apply``),
are placed by ``Scheduler.cycle`` (fair share, the teams' quota tree) and preempted by
``preemption_decisions`` (the preemptor's policy, same tree), each victim checkpointing and
leaving at once. Time moves in steps of ``step_s``; each step: jobs past their run time
end, each team with demand keeps ``backlog`` jobs waiting, one scheduling cycle, one
preemptor call.

Demand varies for the first ``steady_after_h`` hours (each hour every team is busy or idle
at random, so idle teams' guarantees are lent and reclaimed), then is steady: every team
stays busy (and, with ``departures_when_steady`` off, no job ends). Flips are counted
over the whole run and from the start of steady demand (``ReclaimReport.flips``). A *flip* is a reclaim from team X for team Y after the latest reclaim between
the two was from Y for X: preemption going back and forth.

The preemptor runs with its default rules but one: no bound on the work a preemption may
lose for its beneficiary's wait (``max_loss_per_wait``, ``--max-loss-per-wait`` to set
one). With the default bound these jobs, which wait minutes and checkpoint only when
stopped, would seldom be reclaimed: the question here is whether reclaims settle when
nothing else holds them back.

``python -m gpusched.sim.reclaim --teams 2 --seeds 5``: preemptions per hour and flips;
``--publish docs/figures`` runs the published configurations and writes their figures there.
"""
from __future__ import annotations

import argparse
import math
import random
from dataclasses import dataclass, field, replace
from pathlib import Path

from gpusched.core import events as ev
from gpusched.core.model import GpuInfo, JobPhase, JobSpec, NodeInfo, WorkerResources
from gpusched.core.reducer import apply
from gpusched.core.state import ClusterState
from gpusched.policies.preemption.decisions import preemption_decisions, preemption_events
from gpusched.policies.memory import CycleMemory
from gpusched.policies.preemption.victim_rules import PreemptionConfig
from gpusched.policies.queueing.guarantee_hold import DEFAULT_GUARANTEE_HOLD_S
from gpusched.policies.queueing.quota import OrgQuota, QueueTree, TeamQuota
from gpusched.policies.scheduler import Scheduler, SchedulerConfig
from gpusched.sim import figures

SIZES = (1, 1, 2, 4)        # GPUs of a job: mixed, small ones more often


@dataclass(frozen=True, slots=True)
class ReclaimWorkload:
    teams: int = 2
    nodes: int = 4
    gpus_per_node: int = 8
    hours: float = 8.0
    steady_after_h: float = 4.0
    step_s: float = 60.0
    backlog: int = 4                          # jobs a busy team keeps waiting
    runtime_s: tuple[float, float] = (1800.0, 7200.0)
    # False: once demand is steady, nothing ends either (the jobs then running run on), so
    # whatever preempts after that is preemption chasing itself.
    departures_when_steady: bool = True
    seed: int = 0
    guarantee_hold_s: float = DEFAULT_GUARANTEE_HOLD_S   # the cycle's (SchedulerConfig); 0: none


@dataclass(slots=True)
class Preempted:
    time: float
    job_id: str
    victim_team: str
    for_team: str
    reason: str              # "priority" | "reclaim"


@dataclass(slots=True)
class ReclaimReport:
    hours: float
    steady_from_s: float
    preemptions: list[Preempted] = field(default_factory=list)
    # (time, GPU milli allocated, GPU milli in the cluster) after each step's cycle and preemptions
    allocation: list[tuple[float, int, int]] = field(default_factory=list)

    def reclaims(self) -> list[Preempted]:
        return [p for p in self.preemptions if p.reason == "reclaim"]

    def flips(self, since: float = 0.0) -> int:
        """Reclaims from X for Y whose pair's previous reclaim was from Y for X, both at or
        after ``since``: the answer to a change of demand at ``since`` is no flip."""
        last: dict[frozenset, tuple[str, str]] = {}
        flips = 0
        for p in self.reclaims():
            if p.time < since:
                continue
            pair, way = frozenset((p.victim_team, p.for_team)), (p.victim_team, p.for_team)
            if last.get(pair, way) != way:
                flips += 1
            last[pair] = way
        return flips

    def repeated_within(self, window_s: float) -> list[str]:
        """Jobs reclaimed twice less than ``window_s`` apart."""
        seen: dict[str, float] = {}
        out = []
        for p in self.reclaims():
            if p.job_id in seen and p.time - seen[p.job_id] < window_s:
                out.append(p.job_id)
            seen[p.job_id] = p.time
        return out

    def per_hour(self) -> float:
        return len(self.preemptions) / self.hours

    def allocated(self, since: float = 0.0) -> float:
        """Mean fraction of the GPUs allocated, over the steps at or after ``since``."""
        samples = [used / total for t, used, total in self.allocation if t >= since]
        return sum(samples) / len(samples) if samples else 0.0


def _quotas(wl: ReclaimWorkload) -> QueueTree:
    share = wl.nodes * wl.gpus_per_node / wl.teams
    return QueueTree(orgs={"org": OrgQuota(teams={f"t{i}": TeamQuota(guaranteed_gpus=share)
                                                   for i in range(wl.teams)})})


def run(wl: ReclaimWorkload, preemption: PreemptionConfig | None = None) -> ReclaimReport:
    rng = random.Random(wl.seed)
    tree = _quotas(wl)
    config = replace(preemption or PreemptionConfig(max_loss_per_wait=math.inf), quotas=tree)
    # Reservations off: this workload studies preemption between teams, as it always did.
    scheduler = Scheduler(SchedulerConfig(queue="fair-share", quotas=tree, backfill=False, reserve_after_s=math.inf,
                                          guarantee_hold_s=wl.guarantee_hold_s))
    state = ClusterState()
    n = 0

    def put(event_cls, **kw) -> None:
        nonlocal n
        n += 1
        outcome = apply(state, event_cls(event_id=f"e{n}", **kw))
        if not outcome.accepted:
            raise RuntimeError(f"{event_cls.__name__} rejected: {outcome.reason}")

    for i in range(wl.nodes):
        put(ev.NodeRegistered, time=0.0, node=NodeInfo(name=f"n{i}", pool="default", gpus=_gpus(wl.gpus_per_node),
                                                        cpu_milli=1_000_000, memory_mib=10_000_000))
    teams = [f"t{i}" for i in range(wl.teams)]
    runtime: dict[str, float] = {}
    report = ReclaimReport(wl.hours, wl.steady_after_h * 3600)
    busy = {t: True for t in teams}
    k = 0
    now = 0.0
    preempting = CycleMemory()   # what the preemptor's searches keep, as the service keeps it
    while now < wl.hours * 3600:
        if now < report.steady_from_s and now % 3600 < wl.step_s:
            busy = {t: rng.random() < 0.6 for t in teams}
        elif now >= report.steady_from_s:
            busy = {t: True for t in teams}
        if now < report.steady_from_s or wl.departures_when_steady:
            _finish(state, runtime, now, put)
        waiting = {t: 0 for t in teams}
        for jid in state.pending:
            waiting[state.jobs[jid].team] += 1
        for t in teams:
            for _ in range(wl.backlog - waiting[t] if busy[t] else 0):
                k += 1
                spec = _spec(f"j{k}", t, rng.choice(SIZES))
                put(ev.JobSubmitted, time=now, job_id=f"j{k}", spec=spec)
                runtime[f"j{k}"] = rng.uniform(*wl.runtime_s)
        for d in scheduler.cycle(state, now, CycleMemory()):
            put(ev.JobPlaced, time=now, job_id=d.job_id, attempt=d.attempt, workers=d.workers, policy=d.policy)
            for w in d.workers:
                put(ev.WorkerStarted, time=now, job_id=d.job_id, attempt=d.attempt, worker=w.worker, node=w.node)
        for decision in preemption_decisions(state, now, preempting, config):
            for e in preemption_events(state, decision, now):
                victim = state.jobs[e.job_id]
                report.preemptions.append(Preempted(now, e.job_id, victim.team, state.jobs[decision.for_job].team,
                                                    decision.reason))
                put(ev.JobPreempted, time=now, job_id=e.job_id, attempt=e.attempt, for_job=e.for_job,
                    reason=e.reason, planned_nodes=e.planned_nodes)
                for w in victim.workers:     # checkpoint and leave at once
                    put(ev.WorkerFinished, time=now, job_id=victim.job_id, attempt=victim.attempt,
                        worker=w.worker, node=w.node, exit_code=0)
        report.allocation.append((now, sum(u.gpu_milli for u in state.usage.values()),
                                  1000 * wl.nodes * wl.gpus_per_node))
        now += wl.step_s
    return report


def _finish(state: ClusterState, runtime: dict[str, float], now: float, put) -> None:
    for job in [j for j in state.jobs.values() if j.phase is JobPhase.RUNNING]:
        if now - job.started_at >= runtime[job.job_id]:
            for w in job.workers:
                put(ev.WorkerFinished, time=now, job_id=job.job_id, attempt=job.attempt, worker=w.worker,
                    node=w.node, exit_code=0)


def _gpus(count: int) -> tuple[GpuInfo, ...]:
    return tuple(GpuInfo(index=i, uuid=f"GPU-{i}", model="H100-80GB", memory_mib=81_920) for i in range(count))


def _spec(name: str, team: str, gpus: int) -> JobSpec:
    return JobSpec(name=name, team=team, priority_class="training",
                   resources=WorkerResources(gpus=gpus, cpu_milli=0, memory_mib=0))


SUMMARY_HEAD = ("| teams | ending when steady | guarantee hold | preemptions / h | flips | flips once steady "
                "| jobs reclaimed twice within 10 min | GPUs allocated | GPUs allocated once steady |\n"
                "| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
# The published runs (``--publish``): two and three teams with and without departures once
# demand is steady, at the default guarantee hold; then the hold's length, with departures.
PUBLISHED = ([(teams, departures, DEFAULT_GUARANTEE_HOLD_S) for teams in (2, 3) for departures in (True, False)]
             + [(teams, True, hold) for teams in (2, 3) for hold in (0.0, 600.0, 2400.0)])


def summary(teams: int, seeds: int, hours: float, departures: bool, hold_s: float,
            max_loss_per_wait: float = math.inf) -> dict:
    """The sums (means) over ``seeds`` seeds of one configuration."""
    rs = [run(ReclaimWorkload(teams=teams, hours=hours, steady_after_h=hours / 2, seed=seed,
                              departures_when_steady=departures, guarantee_hold_s=hold_s),
              PreemptionConfig(max_loss_per_wait=max_loss_per_wait)) for seed in range(seeds)]
    mean = lambda f: sum(map(f, rs)) / len(rs)   # noqa: E731
    return {"teams": teams, "departures_when_steady": departures, "guarantee_hold_s": hold_s,
            "preemptions_per_hour": round(mean(ReclaimReport.per_hour), 6), "flips": sum(r.flips() for r in rs),
            "flips_once_steady": sum(r.flips(r.steady_from_s) for r in rs),
            "reclaimed_twice_within_10_min": sum(len(r.repeated_within(600.0)) for r in rs),
            "allocated": round(mean(ReclaimReport.allocated), 6),
            "allocated_once_steady": round(mean(lambda r: r.allocated(r.steady_from_s)), 6)}


def summary_row(s: dict) -> str:
    hold = s["guarantee_hold_s"]
    return (f"| {s['teams']} | {'departures' if s['departures_when_steady'] else 'none'} "
            f"| {'0' if hold == 0 else f'{hold / 60:g} min'} | {s['preemptions_per_hour']:.2f} | {s['flips']} "
            f"| {s['flips_once_steady']} | {s['reclaimed_twice_within_10_min']} "
            f"| {100 * s['allocated']:.1f} % | {100 * s['allocated_once_steady']:.1f} % |")


def published_table(data: dict) -> str:
    """The page of the published figures: the runs' settings and a row per configuration."""
    return (f"Sums over seeds 0-{data['seeds'] - 1}, preemptions per hour and allocation averaged; "
            f"{data['hours']:g} h, demand steady after {data['hours'] / 2:g} h.\n\n"
            + SUMMARY_HEAD + "\n" + "\n".join(map(summary_row, data["summaries"])))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--teams", type=int, default=2)
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--hours", type=float, default=8.0)
    p.add_argument("--no-departures-when-steady", action="store_true",
                   help="once demand is steady, no job ends")
    p.add_argument("--summary", action="store_true", help="one row: the sums (means) over the seeds")
    p.add_argument("--guarantee-hold-s", type=float, default=DEFAULT_GUARANTEE_HOLD_S,
                   help="the cycle's guarantee hold (0: free capacity is lent at once)")
    p.add_argument("--max-loss-per-wait", type=float, default=math.inf,
                   help="the preemptor's bound on work lost per GPU-second waited (default: none)")
    p.add_argument("--publish", type=Path, metavar="FOLDER",
                   help="run the published configurations (teams, departures and guarantee holds; "
                        "--seeds and --hours apply) and write their summaries to FOLDER as reclaim.json "
                        "and reclaim.md (the repository's published figures: docs/figures)")
    args = p.parse_args(argv)
    if args.publish:
        rows = [summary(teams, args.seeds, args.hours, departures, hold, args.max_loss_per_wait)
                for teams, departures, hold in PUBLISHED]
        command = figures.command_line("python -m gpusched.sim.reclaim", argv)
        data = {"argv": figures.arguments(argv), "seeds": args.seeds, "hours": args.hours, "summaries": rows}
        for path in figures.publish(args.publish, "reclaim", command, data, published_table(data)):
            print(f"wrote {path}")
        return
    if args.summary:
        print(SUMMARY_HEAD)
        print(summary_row(summary(args.teams, args.seeds, args.hours, not args.no_departures_when_steady,
                                  args.guarantee_hold_s, args.max_loss_per_wait)))
        return
    reports = []
    for seed in range(args.seeds):
        wl = ReclaimWorkload(teams=args.teams, hours=args.hours, steady_after_h=args.hours / 2, seed=seed,
                             departures_when_steady=not args.no_departures_when_steady,
                             guarantee_hold_s=args.guarantee_hold_s)
        reports.append((seed, run(wl, PreemptionConfig(max_loss_per_wait=args.max_loss_per_wait))))
    print("| seed | preemptions/h | reclaims | flips | flips once steady | reclaimed twice within 10 min "
          "| allocated | allocated once steady |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for seed, r in reports:
        print(f"| {seed} | {r.per_hour():.1f} | {len(r.reclaims())} | {r.flips()} | "
              f"{r.flips(r.steady_from_s)} | {len(r.repeated_within(600.0))} | {100 * r.allocated():.1f} % | "
              f"{100 * r.allocated(r.steady_from_s):.1f} % |")


if __name__ == "__main__":
    main()
