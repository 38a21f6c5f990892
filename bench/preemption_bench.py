"""How long the preemptor takes to answer on a large, full pool, and how that grows.

A pool of N nodes with 8 GPUs each is filled with 5 running jobs per node (1+1+2+2+1 or
1+1+2+2+2 GPUs, of mixed priority classes and teams), then two production jobs wait: one
8-GPU job and a 2x8-GPU gang. Timed: ``victims_for`` (the cheapest victim set for one
job) and ``preemption_decisions`` (a whole preemptor pass over the pool). Each size runs
``--repeats`` times, sizes interleaved, and the best time is kept; the ratio between
sizes shows how the search scales with the pool (1.0 per doubling would be constant).

    python bench/preemption_bench.py --nodes 250 1000 --repeats 5
"""
from __future__ import annotations

import argparse
import time

from gpusched.core import events as ev
from gpusched.core.model import GpuInfo, GpuSlot, JobPhase, JobSpec, NodeInfo, WorkerAssignment, WorkerResources
from gpusched.core.reducer import apply
from gpusched.core.state import ClusterState
from gpusched.policies.memory import CycleMemory
from gpusched.policies.preemption.decisions import preemption_decisions, victims_for

NOW = 10_000.0
CLASSES = ("best-effort", "training", "training", "training-high")


class Pool:
    def __init__(self, nodes: int) -> None:
        self.state = ClusterState()
        self.n = 0
        for i in range(nodes):
            gpus = tuple(GpuInfo(g, f"n{i}-g{g}", "H100-80GB", 81_920) for g in range(8))
            self.apply(ev.NodeRegistered, NOW - 3000, node=NodeInfo(
                name=f"n{i:04d}", pool="default", cpu_milli=1_000_000, memory_mib=10_000_000, gpus=gpus))
        k = 0
        for i in range(nodes):
            gpu = 0
            for size in (1, 1, 2, 2, 1 + i % 2):
                k += 1
                spec = JobSpec(name=f"j{k}", team=f"t{k % 7}", priority_class=CLASSES[k % 4],
                               resources=WorkerResources(gpus=size))
                self.apply(ev.JobSubmitted, NOW - 2000, job_id=f"j{k}", spec=spec)
                slots = tuple(GpuSlot(g) for g in range(gpu, gpu + size))
                self.apply(ev.JobPlaced, NOW - 2000, job_id=f"j{k}", attempt=0,
                           workers=(WorkerAssignment(0, f"n{i:04d}", slots),))
                self.apply(ev.WorkerStarted, NOW - 1000 + k % 500, job_id=f"j{k}", attempt=0, worker=0,
                           node=f"n{i:04d}")
                gpu += size
        for job_id, workers in (("big", 1), ("gang", 2)):
            spec = JobSpec(name=job_id, team="prod", priority_class="production-inference", workers=workers,
                           resources=WorkerResources(gpus=8))
            self.apply(ev.JobSubmitted, NOW, job_id=job_id, spec=spec)

    def apply(self, cls, at: float, **kw) -> None:
        self.n += 1
        outcome = apply(self.state, cls(event_id=f"e{self.n}", time=at, **kw))
        assert outcome.accepted, outcome


def timed(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, nargs="+", default=[250, 1000])
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    pools = {n: Pool(n) for n in args.nodes}
    for n, pool in pools.items():
        running = sum(1 for j in pool.state.jobs.values() if j.phase is JobPhase.RUNNING)
        assert running == 5 * n, running
    best: dict[int, list[float]] = {n: [float("inf")] * 2 for n in args.nodes}
    for _ in range(args.repeats):
        for n, pool in pools.items():
            state = pool.state
            one, victims = timed(lambda: victims_for(state, state.jobs["big"], NOW, CycleMemory()))
            many, decisions = timed(lambda: preemption_decisions(state, NOW, CycleMemory()))
            assert victims and [d.for_job for d in decisions] == ["big", "gang"]
            best[n] = [min(best[n][0], one), min(best[n][1], many)]
    base = args.nodes[0]
    print(f"{'nodes':>6} {'running':>8} {'victims_for ms':>15} {'decisions ms':>13} {'ratio vs ' + str(base):>14}")
    for n in args.nodes:
        one, many = best[n]
        print(f"{n:>6} {5 * n:>8} {one * 1000:>15.1f} {many * 1000:>13.1f} "
              f"{one / best[base][0]:>6.2f} / {many / best[base][1]:<5.2f}")


if __name__ == "__main__":
    main()
