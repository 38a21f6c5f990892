"""Benchmark: what launching one worker costs the node, through ``ProcessRun``.

N launches of ``true`` (C in flight), each started and waited for to its end as the agent
does: the worker shim (``shim.c``, built by deploy/setup.sh) spawned by the agent
(``shim_process``), which runs the workload.

CPU per launch: this process (the agent's side) and its reaped descendants (shims,
workloads), from ``getrusage``; wall per launch besides, and the descendants' minor page
faults per launch.

    .venv/bin/python bench/launch_bench.py [--launches 300 --concurrency 8 --rounds 3]
"""
from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

from gpusched_node_agent import shim_process
from gpusched_node_agent.runner import ProcessRun


def cpu() -> tuple[float, float, int]:
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, children.ru_utime + children.ru_stime, children.ru_minflt


async def round_of(launches: int, concurrency: int, root: Path) -> dict:
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with gate:
            run = ProcessRun(("true",), {}, root / f"w{i}", kill_wait=1.0)
            await run.start()
            end = await run.wait()
            if end.exit_code != 0:
                raise RuntimeError(f"launch {i}: {end}")

    (me0, kids0, faults0), wall0 = cpu(), time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(launches)))
    (me1, kids1, faults1), wall1 = cpu(), time.perf_counter()
    return {"agent_ms": (me1 - me0) * 1e3 / launches, "children_ms": (kids1 - kids0) * 1e3 / launches,
            "wall_ms": (wall1 - wall0) * 1e3 / launches, "faults": (faults1 - faults0) / launches}


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if (why := shim_process.missing()) is not None:
        print(f"launch_bench: {why}", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="launch-bench-") as tmp:
        rounds = [await round_of(args.launches, args.concurrency, Path(tmp) / f"r{r}") for r in range(args.rounds)]
    print(f"{args.launches} launches of `true`, {args.concurrency} in flight, median of {args.rounds} rounds"
          " (ms per launch)")
    print(f"{'agent CPU':>10} {'shims+true CPU':>15} {'total CPU':>10} {'wall':>8} {'faults':>7}")
    agent = statistics.median(r["agent_ms"] for r in rounds)
    kids = statistics.median(r["children_ms"] for r in rounds)
    total = statistics.median(r["agent_ms"] + r["children_ms"] for r in rounds)
    wall = statistics.median(r["wall_ms"] for r in rounds)
    faults = statistics.median(r["faults"] for r in rounds)
    print(f"{agent:>10.2f} {kids:>15.2f} {total:>10.2f} {wall:>8.2f} {faults:>7.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
