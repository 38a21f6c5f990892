"""MIG placement throughput: decisions per second of one scheduling cycle through the MIG
index (``gpusched/policies/placement/mig_index.py``, what every policy uses), side by
side with the scan of every node it replaced.

A pool of 1,250 nodes x 8 A100s (128 cores, 1 TiB each; 50 racks under 5 spines), of
which ``--mig-nodes`` (250, every fifth) cut MIG slices on demand and the rest have MIG
off (whole GPUs and shares only), and a backlog of ``--jobs`` (50,000) pending one-worker
jobs: ``--mig-fraction`` (all) of them MIG slices (1g 35 %, 2g 25 %, 3g 20 %, 4g 10 %,
7g 10 %), the rest the openb mix of ``placement_bench.py``. Per policy, one
``Scheduler.cycle`` as the placer runs it (priority queue, at most ``--max-decisions``
placements) with the index, then the same cycle on the same state with the scan put back
(the frozen copy the tests use as their oracle, ``tests/unit/policies/placement/mig_scan.py``; the
product has no scan to select). Both must decide the same; rates are per CPU second.

    .venv/bin/python bench/mig_placement_bench.py [--policies best-fit,fgd] [--mig-nodes 250]
"""
from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.placement_bench import job_resources  # noqa: E402
from gpusched.core import events as ev  # noqa: E402
from gpusched.core.model import GpuInfo, JobSpec, MigMode, NodeInfo, WorkerResources  # noqa: E402
from gpusched.core.reducer import apply  # noqa: E402
from gpusched.core.state import ClusterState  # noqa: E402
from gpusched.policies.memory import CycleMemory
from gpusched.policies.scheduler import Scheduler, SchedulerConfig  # noqa: E402
from tests.unit.policies.placement.mig_scan import scanning  # noqa: E402

MODEL = "A100-80GB"
MIG_MIX = (("1g", 0.35), ("2g", 0.25), ("3g", 0.20), ("4g", 0.10), ("7g", 0.10))


def cluster(nodes: int, mig_nodes: int) -> ClusterState:
    """``mig_nodes`` of the ``nodes`` spread evenly in registration order cut MIG slices."""
    state = ClusterState()
    every = nodes / mig_nodes if mig_nodes else 0
    mig_rows = {int(k * every) for k in range(mig_nodes)}
    for i in range(nodes):
        mode = MigMode.MIXED if i in mig_rows else MigMode.DISABLED
        gpus = tuple(GpuInfo(g, f"n{i}-g{g}", MODEL, 81_920, mig_capable=True, mig_mode=mode) for g in range(8))
        labels = (("rack", f"r{i // 25}"), ("spine", f"s{i // 250}"))
        info = NodeInfo(name=f"node-{i:05d}", pool="default", cpu_milli=128_000, memory_mib=1_048_576,
                        gpus=gpus, labels=labels, simulated=True)
        apply(state, ev.NodeRegistered(event_id=f"reg-{i}", node=info))
    return state


def mig_resources(rng: random.Random) -> WorkerResources:
    profile = rng.choices([p for p, _ in MIG_MIX], weights=[w for _, w in MIG_MIX])[0]
    cpu = rng.choice((1_000, 2_000, 4_000, 8_000))   # a slice's share of the node: slices run out first
    return WorkerResources(mig_profile=profile, cpu_milli=cpu, memory_mib=cpu * 4)


def submit(state: ClusterState, jobs: int, mig_fraction: float, seed: int) -> None:
    rng = random.Random(seed)
    for i in range(jobs):
        res = mig_resources(rng) if rng.random() < mig_fraction else job_resources(rng)
        spec = JobSpec(name=f"job-{i}", team=f"team-{i % 8}", resources=res)
        apply(state, ev.JobSubmitted(event_id=f"sub-{i}", job_id=f"job-{i:06d}", spec=spec))


def timed_cycle(state: ClusterState, policy: str, max_decisions: int) -> tuple[list, float]:
    scheduler = Scheduler(SchedulerConfig(placement=policy, max_decisions=max_decisions))
    cpu = time.process_time()
    decisions = scheduler.cycle(state, now=0.0, memory=CycleMemory())
    return decisions, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policies", default="best-fit,fgd")
    parser.add_argument("--nodes", type=int, default=1250)
    parser.add_argument("--mig-nodes", type=int, default=250)
    parser.add_argument("--jobs", type=int, default=50_000)
    parser.add_argument("--mig-fraction", type=float, default=1.0)
    parser.add_argument("--max-decisions", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    state = cluster(args.nodes, min(args.mig_nodes, args.nodes))
    submit(state, args.jobs, args.mig_fraction, args.seed)
    print(f"{args.nodes} nodes x 8 GPUs ({args.mig_nodes} cut MIG slices), {len(state.pending)} pending jobs "
          f"({args.mig_fraction:.0%} MIG), cycle capped at {args.max_decisions} decisions\n")
    print(f"{'policy':<16}{'decisions':>10}{'MIG':>7}{'index CPU s':>13}{'scan CPU s':>12}"
          f"{'index /s':>10}{'scan /s':>9}{'ratio':>7}")
    for name in args.policies.split(","):
        indexed, index_s = timed_cycle(state, name, args.max_decisions)
        with scanning():
            scanned, scan_s = timed_cycle(state, name, args.max_decisions)
        if [(d.job_id, d.workers) for d in indexed] != [(d.job_id, d.workers) for d in scanned]:
            raise SystemExit(f"{name}: the index and the scan decided differently")
        mig = sum(1 for d in indexed if state.jobs[d.job_id].spec.resources.is_mig)
        n = len(indexed)
        print(f"{name:<16}{n:>10}{mig:>7}{index_s:>13.2f}{scan_s:>12.2f}"
              f"{n / index_s:>10,.0f}{n / scan_s:>9,.0f}{scan_s / index_s:>6.1f}x")


if __name__ == "__main__":
    main()
