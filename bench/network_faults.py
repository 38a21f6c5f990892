"""The cluster under faults of its network and processes, for longer than the test
(tests/integration/test_network_faults.py runs the same rig for about three minutes).

Three brokers, admission, the relay, the placer, the preemptor and N node-agents, each on
a host of its own (a network namespace on a bridge: tests/rig/); short checkpointing jobs
(real processes on simulated GPUs that record their runs) submitted at a steady pace;
the nemesis partitions agents from the brokers and a broker from the others, cuts the
placer's or the preemptor's link, degrades links, pauses and kills processes, and heals,
for the given minutes. Then, once every job has ended: faults by kind, acknowledged jobs
lost, GPU overlaps, double runs, the log's violations, the time from each heal to the
next placement (p50/p99) and the jobs placed again per fault.

    sudo python bench/network_faults.py --minutes 10 --agents 6 --jobs-per-minute 60 --seed 1

The soak (docs/design/faults.md): 30 minutes, two faults at a time, 10,000 jobs:

    sudo python bench/network_faults.py --minutes 30 --agents 8 --gpus-per-agent 4 \
        --jobs-per-minute 334 --job-seconds 2 --at-once 2 --seed 1

Root only. Exit status 1 when an invariant was broken.
"""
from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.rig.nemesis import KINDS  # noqa: E402
from tests.rig.run import run_under_faults  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=5.0, help="minutes of faults")
    parser.add_argument("--agents", type=int, default=6, help="node-agents (4-8)")
    parser.add_argument("--gpus-per-agent", type=int, default=1, help="simulated GPUs of each node-agent")
    parser.add_argument("--at-once", type=int, default=1, help="fault sequences side by side (2: faults overlap)")
    parser.add_argument("--jobs-per-minute", type=float, default=60.0)
    parser.add_argument("--job-seconds", type=float, default=3.0, help="each job's work")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"fault kinds, of {','.join(KINDS)}")
    parser.add_argument("--dir", default="", help="where the run keeps its data and logs (default: a temp dir)")
    args = parser.parse_args()
    root = Path(args.dir or tempfile.mkdtemp(prefix="gpusched-faults-"))
    seconds = args.minutes * 60
    t0 = time.monotonic()
    report = asyncio.run(run_under_faults(
        root, seconds, jobs=max(1, round(args.jobs_per_minute * args.minutes)), agents=args.agents,
        seed=args.seed, kinds=tuple(k for k in args.kinds.split(",") if k), duration=args.job_seconds,
        gpus=args.gpus_per_agent, at_once=args.at_once, settle=max(180.0, args.minutes * 20),
        log=lambda line: print(line, flush=True)))
    print(f"\n--- {args.minutes:g} min of faults, {time.monotonic() - t0:.0f}s in all, data in {root}")
    print(report.figures())
    for v in report.violations:
        print(f"VIOLATION: {v}")
    return 1 if report.violations else 0


if __name__ == "__main__":
    sys.exit(main())
