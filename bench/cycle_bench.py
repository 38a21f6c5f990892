"""Benchmark: a scheduling cycle on a busy pool, where capacity frees between cycles.

What the placer does during a burst: the pool is full, thousands of jobs wait, and
between two cycles a few running jobs end. Each ending bumps ``state.capacity_epoch``,
so parking (``policies.queueing.parking``) cannot skip the waiting jobs: every cycle offers the
whole queue again. Per iteration: ``--ends`` running jobs are cancelled (releasing their
GPUs, as a job's end does), one ``Scheduler.cycle`` runs as the placer calls it (with its
parked set and queue cache), and its decisions are applied as ``JobPlaced`` events.
Prints the mean CPU time of a cycle and the decisions it made. With ``--reasons``, each
cycle is followed by the placer's pending-reason pass (``gpusched_placer.reasons``: the
jobs left pending diagnosed, a reason written where it changed, those events applied),
whose CPU time is printed apart. With ``--node-event cordon`` (``health``) each cycle
follows one node event too: a node cordoned, the next cycle uncordoned (a GPU of it
failing, then healthy again), the next node after that. With ``--node-event register``
a node's agent registers again with the same inventory (a rolling restart), the next
cycle a new node joins (an empty one, in another pool: the cycle's placements stay
those of the others), the next node after that.

    .venv/bin/python bench/cycle_bench.py [--nodes 2] [--pending 3000] [--cycles 300] [--queue priority]
                                          [--reservations] [--reasons] [--policy defaults]
                                          [--job-gpus 1] [--mix openb] [--cold]
                                          [--max-job-test N] [--job-test-head N] [--freeze] [--no-parking]
                                          [--max-cycle-ms MS] [--min-job-test N] [--node-event cordon|health|register]
                                          [--burst N [--gangs F]] [--profile PATH] [--pause-gc]

Without ``--reservations`` the scheduler reserves nothing (``--no-backfill --reserve-after
inf``), the placer's defaults of earlier versions; with it, the reservation settings are
``SchedulerConfig``'s defaults (backfill, reservations after 5 minutes, depth 2).
``--policy defaults`` is the placer's defaults whole (fair share, backfill and
reservations of ``SchedulerConfig()``, the placer's default placement
``gpusched.config.DEFAULT_PLACEMENT``); without it the placement is best-fit. Jobs are 100-milli shares (80 fill a node), or
``--job-gpus`` whole GPUs each; with ``--mix openb`` the waiting jobs are drawn from the
openb trace's GPU tasks (many shapes), the running ones as before. The cycle's CPU time
is printed as mean, p50, p99 and max over the measured cycles. ``--max-job-test`` and
``--job-test-head`` set the budget of jobs a cycle tests and the head a continued cycle
tests again (``policies.queueing.cursor``; a head >= the budget: no cursor, every cycle
from the head of the queue); ``--max-cycle-ms`` and ``--min-job-test`` the bound on a
cycle's time (the placer's flags of the same names; its CPU time here includes the jobs
it takes before the bound may stop it).

The backlog is submitted at once, between two cycles; the placer meets it as it arrives,
each cycle entering the jobs submitted since the one before into its queues (and the
reservation stage building its index of ends once). So the first cycle after the
backlog, which does that for all of it, is run and not measured; every measured cycle
still enters the ``--ends`` jobs submitted before it. ``--cold`` measures it too.

With ``--burst N`` it is scale_bench's burst instead (``burst``): the pool starts empty with
``--pending`` jobs waiting (the first cycle, which enters them, measured with ``--cold``),
openb tasks and a fraction ``--gangs`` of gangs of 2-8 whole nodes of 8 teams (the
``--policy``/``--queue`` settings as above); each cycle's placements are applied and their
workers started, and N more jobs arrive before the next. Since the
pool has room, each cycle places until a bound stops it (``--max-cycle-ms``): what a cycle
costs beyond that bound is what this measures. ``--profile PATH`` cProfiles the measured
cycles.

A cycle's CPU time includes the cyclic GC's collections that fall in it; a full one scans
the whole state (hundreds of thousands of objects here). The services freeze what
survives each full collection (``gpusched.adapters.log.gc_pacing``), so theirs scan only what
came since: ``--freeze`` does that once before the measured cycles (with ``--cold``,
before the backlog's first cycle).
The placer pauses the cyclic GC across each cycle (``gpusched_placer.loop``): with
``--pause-gc`` the measured cycles run so too, and a collection the cycle's allocations
owe runs after it, outside its time, as in the placer. Each mode prints the three longest
cycles with their decisions and gangs.
"""
from __future__ import annotations

import argparse
import cProfile
import gc
import math
import pstats
import random
import time
from dataclasses import replace

from gpusched.adapters.log.gc_pacing import gc_paused
from gpusched.config import DEFAULT_PLACEMENT
from gpusched.core import events as ev
from gpusched.core.model import GpuInfo, JobPhase, JobSpec, NodeInfo, WorkerResources
from gpusched.core.reducer import apply
from gpusched.core.state import ClusterState
from gpusched.policies.memory import CycleMemory
from gpusched.policies.queueing.parking import ParkedJobs
from gpusched.policies.scheduler import CycleResult, Scheduler, SchedulerConfig

PRIORITIES = ("training", "training", "training", "best-effort", "training-high")


def node_info(name: str, pool: str) -> NodeInfo:
    """A node of 8 H100s, as its agent registers it (a fresh object each time)."""
    gpus = tuple(GpuInfo(g, f"{name}-g{g}", "H100-80GB", 81_920) for g in range(8))
    return NodeInfo(name=name, pool=pool, cpu_milli=1_000_000, memory_mib=4_000_000, gpus=gpus, simulated=True)


class Pool:
    """A pool state driven through the reducer, as the placer's follower folds it."""

    def __init__(self, nodes: int, tick: float = 1.0) -> None:
        self.state = ClusterState()
        self.n = 0
        self.tick = tick   # seconds of the log's clock per event
        self.size = nodes   # the nodes the pool started with
        for i in range(nodes):
            self.apply(ev.NodeRegistered, node=node_info(f"node-{i:04d}", "default"))

    def apply(self, cls, **kw) -> None:
        self.n += 1
        apply(self.state, cls(event_id=f"e{self.n}", time=self.now(), **kw))

    def now(self) -> float:
        return self.n * self.tick

    def submit(self, count: int, job_gpus: int = 0, tasks: list[WorkerResources] | None = None) -> None:
        """``count`` jobs: 100-milli shares (the submit bench's job), ``job_gpus`` whole GPUs,
        or resources drawn from ``tasks``."""
        for _ in range(count):
            i = self.n
            if tasks:
                resources = tasks[i % len(tasks)]
            elif job_gpus:
                resources = WorkerResources(gpus=job_gpus, cpu_milli=100, memory_mib=256)
            else:
                resources = WorkerResources(gpu_milli=100, cpu_milli=100, memory_mib=256)
            spec = JobSpec(name=f"job-{i}", team=f"team-{i % 4}", priority_class=PRIORITIES[i % len(PRIORITIES)],
                           resources=resources)
            self.apply(ev.JobSubmitted, job_id=f"job-{i}", spec=spec)

    def node_event(self, kind: str, i: int) -> None:
        """Event ``i`` of a cordon then uncordon (``cordon``), or a GPU failing then healthy
        again (``health``), of node ``i // 2``; or (``register``) node ``i // 2`` registering
        again as it was, then a new node joining another pool."""
        node = f"node-{i // 2 % self.size:04d}"
        if kind == "cordon":
            self.apply(ev.NodeUncordoned if i % 2 else ev.NodeCordoned, node=node)
        elif kind == "register":
            info = node_info(f"spare-{i:06d}", "spare") if i % 2 else node_info(node, "default")
            self.apply(ev.NodeRegistered, node=info)
        else:
            self.apply(ev.GpuHealthChanged, node=node, gpu_index=0, healthy=bool(i % 2))

    def place(self, decisions) -> None:
        for d in decisions:
            self.apply(ev.JobPlaced, job_id=d.job_id, attempt=d.attempt, workers=d.workers)

    def arrive(self, count: int, tasks: list[WorkerResources], gangs: float, rng: random.Random) -> None:
        """``count`` jobs of 8 teams as scale_bench submits them: openb tasks, and a
        fraction ``gangs`` of gangs of 2-8 whole nodes."""
        for _ in range(count):
            i = self.n
            if rng.random() < gangs:
                spec = JobSpec(name=f"gang-{i}", team=f"team-{i % 8}", workers=rng.randint(2, 8),
                               resources=WorkerResources(gpus=8, cpu_milli=8000, memory_mib=32768))
            else:
                spec = JobSpec(name=f"job-{i}", team=f"team-{i % 8}", resources=tasks[i % len(tasks)])
            self.apply(ev.JobSubmitted, job_id=f"job-{i}", spec=spec)

    def start(self, decisions) -> None:
        for d in decisions:
            for w in d.workers:
                self.apply(ev.WorkerStarted, job_id=d.job_id, attempt=d.attempt, worker=w.worker, node=w.node)

    def end_some(self, count: int) -> None:
        """Cancel ``count`` placed jobs and report their workers' ends, as their node-agent
        does: only then does the reducer release their GPUs (docs/guide/workloads.md)."""
        if count <= 0:   # --ends 0: capacity never grows, parking skips the waiting jobs
            return
        running = []
        for job in self.state.jobs.values():   # the oldest placed first: the dict is in submission order
            if job.phase is JobPhase.PLACED:
                running.append(job)
                if len(running) == count:
                    break
        for job in running:
            self.apply(ev.JobCancelled, job_id=job.job_id, reason="ended")
            for w in job.workers:
                self.apply(ev.WorkerFinished, job_id=job.job_id, attempt=job.attempt, worker=w.worker,
                           node=w.node, exit_code=0, reason="cancelled")


def openb_tasks() -> list[WorkerResources]:
    """The openb trace's GPU tasks' resources, model restrictions left out (as scale_bench)."""
    from gpusched.sim import traces
    rng = random.Random(7)
    tasks = [replace(t.resources, gpu_models=()) for t in traces.load_tasks("default")
             if t.resources.gpus or t.resources.gpu_milli]
    rng.shuffle(tasks)
    return tasks


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Measured:
    """The measured cycles, each ``Scheduler.schedule`` timed in CPU, cProfiled with
    ``--profile``, and with ``--pause-gc`` run as the placer runs it: the cyclic GC paused
    across the cycle (``gpusched_placer.loop``), so no collection of the growing state
    falls inside one. ``report`` prints what both modes print."""

    def __init__(self, scheduler: Scheduler, args: argparse.Namespace) -> None:
        self.scheduler, self.path, self.pause = scheduler, args.profile, args.pause_gc
        self.profile = cProfile.Profile() if args.profile else None
        self.ms: list[float] = []
        self.decided = 0
        self.longest: list[tuple[float, int, int]] = []   # (ms, decisions, gangs) of each cycle

    def schedule(self, state: ClusterState, now: float, memory: CycleMemory) -> CycleResult:
        profile = self.profile
        with gc_paused(self.pause):
            if profile is not None:
                profile.enable()
            c0 = time.process_time()
            cycle = self.scheduler.schedule(state, now, memory)
            c1 = time.process_time()
            if profile is not None:
                profile.disable()
        ms, decisions = (c1 - c0) * 1e3, cycle.decisions
        self.ms.append(ms)
        self.decided += len(decisions)
        self.longest.append((ms, len(decisions), sum(len(d.workers) > 1 for d in decisions)))
        return cycle

    def report(self, what: str) -> None:
        ms, cycles = self.ms, len(self.ms)
        print(f"{what}: {sum(ms) / cycles:.2f} ms CPU per cycle (p50 {percentile(ms, 0.5):.2f}, p99 "
              f"{percentile(ms, 0.99):.2f}, max {max(ms):.2f}; {self.decided / cycles:.1f} decisions per cycle, "
              f"{cycles} cycles{', GC paused' if self.pause else ''})")
        print("longest: " + ", ".join(f"{t:.1f} ms ({n} decisions, {g} gangs)"
                                      for t, n, g in sorted(self.longest, reverse=True)[:3]))
        if self.profile is not None:
            self.profile.dump_stats(self.path)
            pstats.Stats(self.path).sort_stats("cumulative").print_stats(25)


def burst(args: argparse.Namespace, scheduler: Scheduler) -> None:
    """``--burst``: what a placer's cycles do while it places a backlog into a pool with room,
    jobs still arriving (scale_bench without the broker). The log's clock moves a
    millisecond an event, so no job ages (fair share's aging: hours) in the run."""
    pool, rng, tasks = Pool(args.nodes, tick=1e-3), random.Random(7), openb_tasks()
    memory = CycleMemory()
    pool.arrive(args.pending, tasks, args.gangs, rng)
    measured = Measured(scheduler, args)
    if args.cold:   # the first cycle measured too: a new replica's, it enters the whole backlog
        gc.collect()
        if args.freeze:
            gc.freeze()
        first = measured.schedule(pool.state, pool.now(), memory).decisions
        print(f"first cycle (enters the backlog): {measured.ms[0]:.1f} ms CPU")
    else:
        first = scheduler.cycle(pool.state, pool.now(), memory)   # enters the backlog: not measured
    pool.place(first)
    pool.start(first)
    gc.collect()
    if args.freeze:
        gc.freeze()
    for _ in range(args.cycles):
        decisions = measured.schedule(pool.state, pool.now(), memory).decisions
        pool.place(decisions)
        pool.start(decisions)
        pool.arrive(args.burst, tasks, args.gangs, rng)
    measured.report(f"burst: {args.nodes:,} 8-GPU nodes, {args.pending:,} waiting at first (openb, {args.gangs:g} "
                    f"gangs), {args.burst} arriving after each cycle, {len(pool.state.pending):,} left")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--pending", type=int, default=3000, help="jobs waiting while the pool is full")
    p.add_argument("--cycles", type=int, default=300)
    p.add_argument("--ends", type=int, default=2, help="running jobs that end before each cycle")
    p.add_argument("--queue", default="priority")
    p.add_argument("--reservations", action="store_true",
                   help="the default reservation settings (backfill, after 5 minutes, depth 2) instead of none")
    p.add_argument("--policy", choices=("defaults",), help="defaults: the placer's defaults whole (fair share, "
                   "backfill, reservations, its default placement); overrides --queue and --reservations")
    p.add_argument("--job-gpus", type=int, default=0, help="whole GPUs a job (0: 100-milli shares)")
    p.add_argument("--mix", choices=("same", "openb"), default="same",
                   help="the waiting jobs: all alike, or drawn from the openb trace's GPU tasks")
    p.add_argument("--max-job-test", type=int, default=None, help="SchedulerConfig.max_job_test (default: its default)")
    p.add_argument("--job-test-head", type=int, default=None,
                   help="SchedulerConfig.job_test_head (default: its default; >= --max-job-test: no cursor)")
    p.add_argument("--max-cycle-ms", type=float, default=None,
                   help="SchedulerConfig.max_cycle_s in ms: the bound on a cycle's time (default: none)")
    p.add_argument("--min-job-test", type=int, default=None,
                   help="SchedulerConfig.min_job_test: jobs a cycle takes before the bound may stop it")
    p.add_argument("--no-parking", action="store_true", help="without the parked set: every cycle offers every job")
    p.add_argument("--reasons", action="store_true", help="also the placer's pending-reason pass after each cycle")
    p.add_argument("--node-event", choices=("cordon", "health", "register"), help="one node event before each "
                   "cycle: a cordon or an uncordon, a GPU failing or healthy again, a node registering again or a "
                   "new one joining")
    p.add_argument("--freeze", action="store_true", help="gc.freeze() once the backlog is in, as a service's "
                   "GC pacing (gpusched.adapters.log.gc_pacing) does after each full collection: the cycles' "
                   "figures then leave out full collections of the whole state")
    p.add_argument("--pause-gc", action="store_true", help="the cyclic GC paused across each measured cycle, "
                   "as the placer pauses it (gpusched_placer.loop): no collection inside a cycle")
    p.add_argument("--burst", type=int, metavar="N", default=None,
                   help="scale_bench's burst instead: an empty pool, --pending jobs waiting (openb tasks and "
                        "--gangs), each cycle's placements applied and started, then N more jobs arrive")
    p.add_argument("--gangs", type=float, default=0.002, help="--burst: the fraction of gangs of 2-8 whole nodes")
    p.add_argument("--profile", metavar="PATH", help="cProfile the measured cycles (not the pending-reason "
                   "pass) and write the stats to PATH (pstats; the top 25 by cumulative time are printed)")
    p.add_argument("--cold", action="store_true", help="measure the first cycle after the backlog arrived too "
                   "(it enters every waiting job into the queues and builds what cycles keep)")
    args = p.parse_args()
    pool = Pool(args.nodes)
    placement = {"placement": DEFAULT_PLACEMENT} if args.policy == "defaults" else {}
    if args.policy == "defaults":
        args.queue, args.reservations = "fair-share", True
    reserve = {} if args.reservations else {"backfill": False, "reserve_after_s": math.inf}
    budget = {name: value for name, value in (("max_job_test", args.max_job_test),
                                              ("job_test_head", args.job_test_head),
                                              ("min_job_test", args.min_job_test)) if value is not None}
    if args.max_cycle_ms is not None:
        budget["max_cycle_s"] = args.max_cycle_ms / 1e3
    scheduler = Scheduler(SchedulerConfig(queue=args.queue, **reserve, **budget, **placement))
    if args.burst is not None:
        return burst(args, scheduler)
    kept = CycleMemory()

    def memory() -> CycleMemory:
        """What the cycles keep; with ``--no-parking`` no job stays parked from one to the next."""
        if args.no_parking:
            kept.parked = ParkedJobs()
        return kept
    per_node = 8 // args.job_gpus if args.job_gpus else 80   # 80 shares fill a node
    pool.submit(args.nodes * per_node, args.job_gpus)
    while pool.state.pending:   # fill the pool (a cycle decides up to max_decisions)
        decisions = scheduler.cycle(pool.state, pool.now(), memory())
        if not decisions:
            break
        pool.place(decisions)
    tasks = openb_tasks() if args.mix == "openb" else None
    pool.submit(args.pending, args.job_gpus, tasks)
    if not args.cold:
        # The placer enters jobs into its queues as they arrive (each cycle enters those
        # submitted since the one before) and builds what it keeps between cycles once:
        # one cycle, not measured, does both for the backlog submitted at once here.
        pool.place(scheduler.cycle(pool.state, pool.now(), memory()))
    reasons = None
    if args.reasons:
        from gpusched_placer.reasons import PendingReasons   # the service's module: installed with the package
        reasons = PendingReasons("bench")
    gc.collect()
    if args.freeze:
        gc.freeze()
    measured = Measured(scheduler, args)
    why_cpu, written = 0.0, 0
    for i in range(args.cycles):
        pool.end_some(args.ends)
        pool.submit(args.ends, args.job_gpus, tasks)   # the queue keeps its length
        if args.node_event:
            pool.node_event(args.node_event, i)
        now = pool.now()
        cycle = measured.schedule(pool.state, now, memory())
        if reasons is not None:
            c1 = time.process_time()
            why = reasons.after_cycle(0, pool.state, now, cycle, kept)
            why_cpu += time.process_time() - c1
            written += len(why)
            for e in why:
                apply(pool.state, e)
        pool.place(cycle.decisions)
    what = f"defaults (fair share, {DEFAULT_PLACEMENT}, backfill, reservations)" if args.policy else \
        f"{args.queue} queue{' with reservations' if args.reservations else ''}"
    measured.report(f"{what}, {args.nodes:,} full 8-GPU nodes, {len(pool.state.pending):,} pending ({args.mix}), "
                    f"{args.ends} jobs ending{f' and a {args.node_event} event' if args.node_event else ''} "
                    f"before each cycle")
    if reasons is not None:
        print(f"pending-reason pass: {why_cpu / args.cycles * 1e3:.2f} ms CPU per cycle, "
              f"{written / args.cycles:.1f} reasons written per cycle")


if __name__ == "__main__":
    main()
