"""Placement throughput: decisions per second of one scheduling cycle, per policy.

A pool of 1,250 nodes x 8 GPUs (128 cores, 1 TiB each; 50 racks under 5 spines) and
50,000 pending one-worker jobs shaped like the openb trace's mix (GPU shares, 1/2/4/8
whole GPUs, CPU-only). One ``Scheduler.cycle`` per policy, as the placer runs it (the
placer's queue policy unless ``--queue`` names another, at most ``--max-decisions``
placements, default the placer's 10,000, and the placer's budget of jobs tested,
``max_job_test``, 2,500 by default), on the same state each time; a decision is one
placement returned. ``--queue all`` runs every queue policy in turn, and each policy's
rate is also given as a share of the first policy's (best-fit by default) in that queue. The target is >= 10,000 decisions/s for the default policy. Rates
are per CPU second of the benchmark process (the cycle is single-threaded; wall time is
printed too). The state is frozen for the cyclic GC once built, as the placer freezes
what it folded (``gc_pacing``), so a collection does not rescan 50,000 jobs.

``--kept`` measures the cycle the placer runs once warm: with what it keeps for a state
between cycles (``CycleMemory``: queue keys, the cursor, the placement indexes and FGD's
task count), after one cycle whose decisions the log accepted (each policy on its own
copy of the state, built alike), so the kept structures are brought in step from 2,500
placements, as between two placer cycles.

    .venv/bin/python bench/placement_bench.py [--policies best-fit,fgd] [--queue priority|all] [--nodes 1250] [--jobs 50000] [--kept]
"""
from __future__ import annotations

import argparse
import gc
import random
import time

from gpusched.core import events as ev
from gpusched.core.model import GpuInfo, JobSpec, NodeInfo, WorkerResources
from gpusched.core.reducer import apply
from gpusched.core.state import ClusterState
from gpusched.policies.memory import CycleMemory
from gpusched.policies.placement.registry import PLACEMENTS
from gpusched.policies.queueing.order import QUEUE_ORDERS
from gpusched.policies.scheduler import Scheduler, SchedulerConfig

MODEL = "A100-80GB"
SHARES = (110, 160, 230, 320, 370, 460, 470, 550, 590, 650, 810)


def cluster(nodes: int) -> ClusterState:
    state = ClusterState()
    for i in range(nodes):
        gpus = tuple(GpuInfo(g, f"n{i}-g{g}", MODEL, 81_920) for g in range(8))
        labels = (("rack", f"r{i // 25}"), ("spine", f"s{i // 250}"))
        info = NodeInfo(name=f"node-{i:05d}", pool="default", cpu_milli=128_000, memory_mib=1_048_576,
                        gpus=gpus, labels=labels, simulated=True)
        apply(state, ev.NodeRegistered(event_id=f"reg-{i}", node=info))
    return state


def job_resources(rng: random.Random) -> WorkerResources:
    """About the openb mix: 38 % shares, 46 % one GPU, 1.5 % multi-GPU, 14 % CPU-only."""
    x = rng.random()
    cpu = rng.choice((2_000, 4_000, 8_000, 12_000, 16_000))
    mem = cpu * 4
    if x < 0.38:
        return WorkerResources(gpu_milli=rng.choice(SHARES), cpu_milli=cpu, memory_mib=mem)
    if x < 0.84:
        return WorkerResources(gpus=1, cpu_milli=cpu, memory_mib=mem)
    if x < 0.855:
        gpus = rng.choice((2, 4, 8))
        return WorkerResources(gpus=gpus, cpu_milli=cpu * gpus // 2, memory_mib=mem * gpus // 2)
    return WorkerResources(cpu_milli=cpu, memory_mib=mem)


def submit(state: ClusterState, jobs: int, seed: int) -> None:
    rng = random.Random(seed)
    for i in range(jobs):
        spec = JobSpec(name=f"job-{i}", team=f"team-{i % 8}", resources=job_resources(rng))
        apply(state, ev.JobSubmitted(event_id=f"sub-{i}", job_id=f"job-{i:06d}", spec=spec))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policies", default=",".join(PLACEMENTS))
    parser.add_argument("--nodes", type=int, default=1250)
    parser.add_argument("--jobs", type=int, default=50_000)
    parser.add_argument("--queue", default=SchedulerConfig().queue,
                        help="queue policy, comma-separated ones, or 'all' (default: the placer's)")
    parser.add_argument("--max-decisions", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--kept", action="store_true",
                        help="time the cycle after one whose decisions were applied, with the kept QueueKeys")
    args = parser.parse_args()
    state = build(args.nodes, args.jobs, args.seed)
    queues = sorted(QUEUE_ORDERS) if args.queue == "all" else args.queue.split(",")
    print(f"{args.nodes} nodes x 8 GPUs, {len(state.pending)} pending jobs, "
          f"cycle capped at {args.max_decisions} decisions and {SchedulerConfig().max_job_test} jobs tested"
          + (", the cycle after one applied, with a kept memory" if args.kept else ""))
    fresh = (lambda: build(args.nodes, args.jobs, args.seed)) if args.kept else None
    for queue in queues:
        cycles(state, queue, args.policies.split(","), args.max_decisions, fresh)


def build(nodes: int, jobs: int, seed: int) -> ClusterState:
    state = cluster(nodes)
    submit(state, jobs, seed)
    gc.collect()
    gc.freeze()
    return state


def warm(state: ClusterState, scheduler: Scheduler) -> CycleMemory:
    """One cycle with kept structures, its decisions accepted by the log: the placer's
    state and memory before its next cycle."""
    memory = CycleMemory()
    for d in scheduler.cycle(state, 0.0, memory):
        apply(state, ev.JobPlaced(event_id=f"place-{d.job_id}", job_id=d.job_id, attempt=d.attempt,
                                  workers=d.workers))
    gc.collect()
    gc.freeze()
    return memory


def cycles(state: ClusterState, queue: str, policies: list[str], max_decisions: int, fresh=None) -> None:
    # CPU seconds of this process next to wall seconds: the machine is shared, and a
    # cycle is single-threaded, so CPU time is what the policy costs.
    print(f"\n{queue} queue")
    print(f"{'policy':<16}{'decisions':>10}{'GPUs placed':>13}{'wall s':>8}{'CPU s':>7}{'decisions/s (CPU)':>19}"
          f"{'share of ' + policies[0]:>22}")
    first = None
    for name in policies:
        scheduler = Scheduler(SchedulerConfig(queue=queue, placement=name, max_decisions=max_decisions))
        memory = CycleMemory()
        if fresh is not None:   # each policy on its own copy, one cycle applied
            state = fresh()
            memory = warm(state, scheduler)
        wall, cpu = time.perf_counter(), time.process_time()
        decisions = scheduler.cycle(state, 0.0, memory)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        gpus = sum(state.jobs[d.job_id].milli for d in decisions) / 1000
        rate = len(decisions) / cpu
        first = first or rate
        print(f"{name:<16}{len(decisions):>10}{gpus:>13,.0f}{wall:>8.2f}{cpu:>7.2f}{rate:>19,.0f}{rate / first:>22.2f}")


if __name__ == "__main__":
    main()
