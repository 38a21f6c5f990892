"""Benchmark: what tracing costs the fold (``gpusched.adapters.log.fold.fold_records``), side by
side in one process: the pool workload (``pool_workload.py``) encoded as records whose job
events carry a W3C context (as admission writes them), folded into fresh states with
tracing off, then on while replaying (contexts noted, no spans), then on live (a span per
record about a job; a recording provider with no exporter: the span work itself). The
cyclic GC is off; best of ``--repeat``; per record, in µs, and the ratio.

    .venv/bin/python bench/trace_fold_bench.py --count 100000
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import time
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.pool_workload import PoolSim  # noqa: E402
from gpusched.adapters.log import codec  # noqa: E402
from gpusched.adapters.telemetry import tracing
from gpusched.adapters.log.fold import fold_records  # noqa: E402
from gpusched.adapters.log.publisher import DeadLetters  # noqa: E402
from gpusched.core.state import ClusterState  # noqa: E402

CONTEXT = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}


class Record(NamedTuple):
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes


def fold(records: list[Record], live: bool = True) -> float:
    state = ClusterState()
    tracing.JOBS.clear()
    gc.disable()
    started = time.process_time()
    asyncio.run(fold_records("bench", state, records, None, DeadLetters(None, "bench"), live=live))
    elapsed = time.process_time() - started
    gc.enable()
    return elapsed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--count", type=int, default=100_000)
    p.add_argument("--nodes", type=int, default=2000)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    sim = PoolSim(7, args.nodes)
    sim.run(args.count)
    records = [Record("bench.events", 0, i, b"default",
                      codec.encode(e, "default", CONTEXT if getattr(e, "job_id", None) else None))
               for i, e in enumerate(sim.events)]
    off = min(fold(records) for _ in range(args.repeat))
    tracing.setup_tracing("bench", always=True)
    replay = min(fold(records, live=False) for _ in range(args.repeat))
    on = min(fold(records) for _ in range(args.repeat))
    n = len(records)
    print(f"{n} records ({sum(1 for e in sim.events if getattr(e, 'job_id', None))} about jobs), "
          f"best of {args.repeat}: tracing off {1e6 * off / n:.2f} µs/record; on, replaying "
          f"{1e6 * replay / n:.2f} (x{replay / off:.2f}); on, live {1e6 * on / n:.2f} (x{on / off:.2f})")


if __name__ == "__main__":
    main()
