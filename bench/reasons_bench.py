"""Benchmark: the placer's pending-reasons pass (``gpusched_placer.reasons``) on a full pool
with a long queue, with the kept free-capacity index against a scan of every node.

The pool of ``bench/cycle_bench.py``: ``--nodes`` 8-GPU nodes full of 1-GPU jobs,
``--pending`` jobs waiting (the openb trace's GPU tasks: many shapes), the placer's
defaults (fair share, backfill, reservations, its default placement). Per iteration,
``--ends`` running jobs end and as many are submitted, a cycle runs, then two passes
ask about the state it left, one after the other in rotating order: one reading the
nodes through the cycle's own kept index (its ``CycleMemory``, as the placer's pass does),
one through an index it keeps between passes itself, one scanning every node of the pool
for every shape (``keep_indexes=False``). Their events must be the same (job, attempt,
reason: checked every pass); the first's are applied, as the placer's would be.
Prints the CPU time of a pass for each, the first apart (a pass keeping its own index
builds it and its journal reader there, as after a node change), then mean, p50, p99 and
max, and the ratios of the means. With ``--node-event`` each cycle follows one node event
too (``cycle_bench.Pool.node_event``: a cordon or uncordon, a GPU failing or healthy again).

    .venv/bin/python bench/reasons_bench.py [--nodes 5000] [--pending 45000] [--passes 40] [--ends 2]
                                            [--big-ends N] [--node-event cordon|health]
"""
from __future__ import annotations

import argparse
import gc
import time

from cycle_bench import Pool, openb_tasks, percentile

from gpusched.config import DEFAULT_PLACEMENT
from gpusched.core.reducer import apply
from gpusched.policies.memory import CycleMemory
from gpusched.policies.scheduler import Scheduler, SchedulerConfig
from gpusched_placer.reasons import PendingReasons


def full_pool(nodes: int, pending: int, scheduler: Scheduler, memory: CycleMemory):
    """A pool of ``nodes`` full 8-GPU nodes with ``pending`` openb jobs waiting, the backlog's
    first cycle run (as cycle_bench: the placer meets the jobs as they arrive)."""
    pool = Pool(nodes)
    pool.submit(nodes * 8, 1)
    while pool.state.pending:
        decisions = scheduler.cycle(pool.state, pool.now(), memory)
        if not decisions:
            break
        pool.place(decisions)
    tasks = openb_tasks()
    pool.submit(pending, 1, tasks)
    pool.place(scheduler.cycle(pool.state, pool.now(), memory))
    return pool, tasks


def timed(reasons: PendingReasons, pool: Pool, now: float, cycle, memory: CycleMemory) -> tuple[float, list]:
    c0 = time.process_time()
    events = reasons.after_cycle(0, pool.state, now, cycle, memory)
    return (time.process_time() - c0) * 1e3, events


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=5000)
    p.add_argument("--pending", type=int, default=45000)
    p.add_argument("--passes", type=int, default=40, help="passes measured, the first included (at least 2)")
    p.add_argument("--ends", type=int, default=2, help="running jobs that end (and jobs submitted) before each cycle")
    p.add_argument("--big-ends", type=int, default=0, metavar="N",
                   help="before every other cycle N jobs end instead (the cycle places up to max_job_test of the "
                        "waiting, and the pass after it books them all)")
    p.add_argument("--node-event", choices=("cordon", "health"), help="one node event before each cycle")
    args = p.parse_args()
    scheduler = Scheduler(SchedulerConfig(queue="fair-share", placement=DEFAULT_PLACEMENT))
    memory = CycleMemory()
    pool, tasks = full_pool(args.nodes, args.pending, scheduler, memory)
    passes = {"cycle's index": (PendingReasons("bench"), memory), "own index": (PendingReasons("bench"), CycleMemory()),
              "every node": (PendingReasons("bench", keep_indexes=False), CycleMemory())}
    names = list(passes)
    gc.collect()
    gc.freeze()   # as the services' GC pacing: the state is not rescanned by every collection
    times: dict[str, list[float]] = {name: [] for name in names}
    written = 0
    for i in range(args.passes):
        ends = args.big_ends if args.big_ends and i % 2 else args.ends
        pool.end_some(ends)
        pool.submit(ends, 1, tasks)
        if args.node_event:
            pool.node_event(args.node_event, i)
        now = pool.now()
        cycle = scheduler.schedule(pool.state, now, memory)
        turn = i // 2 % len(names)   # not in step with --big-ends
        found = {}
        for name in names[turn:] + names[:turn]:
            ms, found[name] = timed(*passes[name][:1], pool, now, cycle, passes[name][1])
            times[name].append(ms)
        same = [(e.job_id, e.attempt, e.reason) for e in found["cycle's index"]]
        for name in names[1:]:
            assert same == [(e.job_id, e.attempt, e.reason) for e in found[name]], "the passes differ"
        written += len(same)
        for e in found["cycle's index"]:
            apply(pool.state, e)
        pool.place(cycle.decisions)
    every = f", {args.big_ends} before every other" if args.big_ends else ""
    every += f", a {args.node_event} event before each" if args.node_event else ""
    print(f"{args.nodes:,} full 8-GPU nodes, {len(pool.state.pending):,} pending (openb), {args.ends} ending "
          f"before each cycle{every}; {written / args.passes:.1f} reasons written per pass, the same every way")
    for name, ms in times.items():   # the first pass builds what the kept one keeps: apart
        rest = ms[1:]
        print(f"  pass, {name}: first {ms[0]:.1f} ms CPU, then {sum(rest) / len(rest):.2f} (p50 "
              f"{percentile(rest, 0.5):.2f}, p99 {percentile(rest, 0.99):.2f}, max {max(rest):.2f}; {len(rest)} passes)")
    mean = {name: sum(ms[1:]) / len(ms[1:]) for name, ms in times.items()}
    for name in names[:2]:
        print(f"  ratio {name} / every node after the first pass: {mean[name] / mean['every node']:.3f}x the mean")
    print(f"  ratio cycle's index / own index after the first pass: "
          f"{mean[names[0]] / mean[names[1]]:.3f}x the mean")


if __name__ == "__main__":
    main()
