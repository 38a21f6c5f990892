"""CPU time of one preemptor round on a full pool, with the placer's views kept for the
round (the code as it is) and built afresh for every pending job (the test oracle
``tests/unit/policies/preemption_oracle.py``, the code as it was), alternated in one run.

A pool of N nodes with 8 GPUs each runs one 1-GPU ``training`` job per GPU (past its
exempt time, checkpointable); P ``training-high`` 1-GPU jobs wait, of a few CPU sizes (so
the placer is asked about several shapes). Timed per round (CPU seconds, best of
``--repeats``): ``preemption_decisions`` (which stops after 8 decisions) and
``defrag_decisions`` (which looks at every pending job: none is blocked by fragmentation
only, the pool being full). Both versions' decisions are checked to be equal.

    python bench/preemptor_bench.py --nodes 1000 4000 --pending 64 --repeats 5
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpusched.core import events as ev  # noqa: E402
from gpusched.core.model import GpuInfo, GpuSlot, JobSpec, NodeInfo, WorkerAssignment, WorkerResources  # noqa: E402
from gpusched.core.reducer import apply  # noqa: E402
from gpusched.core.state import ClusterState  # noqa: E402
from gpusched.policies.preemption.decisions import preemption_decisions  # noqa: E402
from gpusched.policies.preemption.defrag import defrag_decisions  # noqa: E402
from tests.unit.policies import preemption_oracle as oracle  # noqa: E402

NOW = 10_000.0


def full_pool(nodes: int, pending: int) -> ClusterState:
    state = ClusterState()
    n = 0

    def put(cls, at: float, **kw) -> None:
        nonlocal n
        n += 1
        outcome = apply(state, cls(event_id=f"e{n}", time=at, **kw))
        assert outcome.accepted, outcome

    for i in range(nodes):
        gpus = tuple(GpuInfo(g, f"n{i}-g{g}", "H100-80GB", 81_920) for g in range(8))
        put(ev.NodeRegistered, NOW - 3000, node=NodeInfo(
            name=f"n{i:05d}", pool="default", cpu_milli=128_000, memory_mib=1_000_000, gpus=gpus))
    for i in range(nodes):
        for g in range(8):
            job_id = f"r{i}-{g}"
            spec = JobSpec(name=job_id, team=f"t{(i + g) % 5}", priority_class="training",
                           resources=WorkerResources(gpus=1, cpu_milli=4000), checkpoint_interval_s=300.0)
            put(ev.JobSubmitted, NOW - 2000, job_id=job_id, spec=spec)
            put(ev.JobPlaced, NOW - 2000, job_id=job_id, attempt=0,
                workers=(WorkerAssignment(0, f"n{i:05d}", (GpuSlot(g),)),))
            put(ev.WorkerStarted, NOW - 1900 + (i * 8 + g) % 500, job_id=job_id, attempt=0, worker=0,
                node=f"n{i:05d}")
    for k in range(pending):
        spec = JobSpec(name=f"p{k}", team=f"t{k % 5}", priority_class="training-high",
                       resources=WorkerResources(gpus=1, cpu_milli=1000 * (1 + k % 4)))
        put(ev.JobSubmitted, NOW - 10, job_id=f"p{k}", spec=spec)
    return state


def cpu(fn) -> tuple[float, object]:
    t0 = time.process_time()
    out = fn()
    return time.process_time() - t0, out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, nargs="+", default=[1000, 4000])
    p.add_argument("--pending", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    pools = {n: full_pool(n, args.pending) for n in args.nodes}
    rounds = {"preemption": (preemption_decisions, oracle.preemption_decisions),
              "defrag": (defrag_decisions, oracle.defrag_decisions)}
    best = {(n, r, v): float("inf") for n in pools for r in rounds for v in ("kept", "fresh")}
    for _ in range(args.repeats):
        for n, state in pools.items():
            for r, (kept, fresh) in rounds.items():
                t_fresh, want = cpu(lambda: fresh(state, NOW))
                t_kept, got = cpu(lambda: kept(state, NOW))
                assert got == want, (n, r)
                best[n, r, "fresh"] = min(best[n, r, "fresh"], t_fresh)
                best[n, r, "kept"] = min(best[n, r, "kept"], t_kept)
    print(f"{'nodes':>6} {'round':>11} {'fresh views ms':>15} {'kept views ms':>14} {'speed-up':>9}")
    for n in pools:
        for r in rounds:
            fresh, kept = best[n, r, "fresh"], best[n, r, "kept"]
            print(f"{n:>6} {r:>11} {fresh * 1000:>15.1f} {kept * 1000:>14.1f} {fresh / kept:>8.1f}x")


if __name__ == "__main__":
    main()
