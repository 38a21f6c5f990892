"""Benchmark: one scheduling cycle that places gangs among thousands of jobs on an empty pool.

``--nodes`` empty 8-GPU nodes (no rack labels), ``--jobs`` pending jobs: 40 % shares of
one GPU, 59.5 % one-worker jobs of 1–8 whole GPUs, 0.5 % gangs of 2–8 workers of 8 GPUs
(seeded). Per repeat, one ``Scheduler.cycle`` on the same state (a cycle leaves the state
as it found it); prints the CPU time of each and the decisions made.

    .venv/bin/python bench/gang_cycle_bench.py [--nodes 5000] [--jobs 5000] [--policy best-fit] [--repeat 3]
"""
from __future__ import annotations

import argparse
import random
import time

from cycle_bench import Pool

from gpusched.core import events as ev
from gpusched.core.model import JobSpec, WorkerResources
from gpusched.policies.memory import CycleMemory
from gpusched.policies.scheduler import Scheduler, SchedulerConfig


def submit_mix(pool: Pool, jobs: int, seed: int = 1) -> None:
    rng = random.Random(seed)
    for i in range(jobs):
        r, workers = rng.random(), 1
        if r < 0.4:
            res = WorkerResources(gpu_milli=rng.choice([250, 500, 810]), cpu_milli=1000, memory_mib=1024)
        elif r < 0.995:
            res = WorkerResources(gpus=rng.choice([1, 1, 2, 4, 8]), cpu_milli=4000, memory_mib=4096)
        else:
            res, workers = WorkerResources(gpus=8, cpu_milli=4000, memory_mib=4096), rng.randint(2, 8)
        spec = JobSpec(name=f"j{i}", team=f"t{i % 4}", resources=res, workers=workers)
        pool.apply(ev.JobSubmitted, job_id=f"j{i}", spec=spec)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=5000)
    p.add_argument("--jobs", type=int, default=5000)
    p.add_argument("--policy", default="best-fit")
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    pool = Pool(args.nodes)
    submit_mix(pool, args.jobs)
    for _ in range(args.repeat):
        scheduler = Scheduler(SchedulerConfig(placement=args.policy))
        started = time.process_time()
        decisions = scheduler.cycle(pool.state, float(pool.n), CycleMemory())
        cpu = time.process_time() - started
        gangs = sum(len(d.workers) > 1 for d in decisions)
        print(f"{args.nodes} nodes, {args.jobs} jobs, {args.policy}: {len(decisions)} decisions "
              f"({gangs} gangs) in {cpu * 1000:.0f} ms CPU")


if __name__ == "__main__":
    main()
