"""Benchmark: a placer's first cycles on a pool it takes over in a burst.

A pool of ``--nodes`` 8-GPU nodes is driven by one placer's cycles through scale_bench's
burst (``cycle_bench.burst``'s jobs: openb tasks and gangs of 8 teams, ``--burst`` more
arriving after each cycle) for ``--before`` cycles; then a new placer
(``gpusched_placer.loop.PlacementDecider`` with the placer's default settings, or
``--placer-args``) takes the pool as it is and runs ``--cycles`` rounds, each round's
placements applied and started. Its ``--cycle-log`` lines give each cycle's wall and CPU
time: the first against the rest. ``--no-warm`` takes the pool without warming it
(``PlacementDecider._warmed``), as placers did before; the time of the first round
(warming, cycle and reasons pass) is printed apart.

    .venv/bin/python bench/first_cycle_bench.py [--nodes 5000] [--pending 50000] [--before 20]
                                                [--cycles 30] [--burst 500] [--no-warm] [--placer-args '...']
"""
from __future__ import annotations

import argparse
import gc
import os
import random
import shlex
import sys
import tempfile
import time

from gpusched.config import PlacerSettings
from gpusched.core import events as ev
from gpusched.core.reducer import apply
from gpusched.policies.memory import CycleMemory
from gpusched.policies.scheduler import Scheduler
from gpusched_placer import cycle_log
from gpusched_placer.cycle_log import CycleLog
from gpusched_placer.loop import PlacementDecider
from gpusched_placer.main import scheduler_config

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cycle_bench import Pool, openb_tasks, percentile   # noqa: E402  (a sibling script, not a package)


def placer_settings(text: str) -> PlacerSettings:
    parser = argparse.ArgumentParser()
    PlacerSettings.add_args(parser, {})
    return PlacerSettings.from_args(parser.parse_args(shlex.split(text)), {})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=5000)
    p.add_argument("--pending", type=int, default=50_000, help="jobs waiting when the burst starts")
    p.add_argument("--before", type=int, default=20, help="cycles of the first placer before the takeover")
    p.add_argument("--cycles", type=int, default=30, help="rounds of the placer that takes over")
    p.add_argument("--burst", type=int, default=500, help="jobs arriving after each cycle")
    p.add_argument("--gangs", type=float, default=0.002, help="the fraction of gangs of 2-8 whole nodes")
    p.add_argument("--no-warm", action="store_true", help="take the pool without warming it")
    p.add_argument("--placer-args", default="", help="the placer's flags, e.g. '--max-cycle-ms 0'")
    args = p.parse_args()
    config = scheduler_config(placer_settings(args.placer_args))
    pool, rng, tasks = Pool(args.nodes, tick=1e-3), random.Random(7), openb_tasks()
    pool.arrive(args.pending, tasks, args.gangs, rng)
    first, memory = Scheduler(config), CycleMemory()
    for _ in range(args.before):
        decisions = first.cycle(pool.state, pool.now(), memory)
        pool.place(decisions)
        pool.start(decisions)
        pool.arrive(args.burst, tasks, args.gangs, rng)
    del first, memory
    gc.collect()
    gc.freeze()   # as the services' GC pacing leaves a replayed state
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "cycles.log")
        log = CycleLog.open(path)
        decider = PlacementDecider(Scheduler(config), "bench", log)
        if args.no_warm:
            decider._warm = lambda memory, state, now: None
        rounds = []
        for _ in range(args.cycles):
            t0 = time.perf_counter()
            events = decider(0, pool.state, pool.now())
            rounds.append((time.perf_counter() - t0) * 1e3)
            placed = [e for e, _ in events if type(e) is ev.JobPlaced]
            pool.place(placed)
            for e, _ in events:   # the pending reasons, folded as the follower folds them
                if type(e) is ev.JobPendingReason:
                    decider.on_event(0, 0, e, apply(pool.state, e), pool.state)
            pool.start(placed)
            pool.arrive(args.burst, tasks, args.gangs, rng)
        log.close()
        cycles = cycle_log.read(path)
    rest = cycles[1:]
    walls, cpus = [c["wall_ms"] for c in rest], [c["cpu_ms"] for c in rest]
    print(f"{args.nodes:,} nodes, {len(pool.state.pending):,} waiting at the end, "
          f"{'not ' if args.no_warm else ''}warmed; bound {config.max_cycle_s * 1e3:g} ms, "
          f"min_job_test {config.min_job_test}")
    print(f"first cycle: wall {cycles[0]['wall_ms']:.1f} ms, CPU {cycles[0]['cpu_ms']:.1f} ms, "
          f"{cycles[0]['placed']:.0f} placed; its whole round (warming, cycle, reasons) {rounds[0]:.1f} ms")
    print(f"the next {len(rest)}: wall p50 {percentile(walls, 0.5):.1f} / max {max(walls):.1f} ms, CPU p50 "
          f"{percentile(cpus, 0.5):.1f} / max {max(cpus):.1f} ms, {sum(c['placed'] for c in rest) / len(rest):.0f} "
          f"placed a cycle")


if __name__ == "__main__":
    main()
