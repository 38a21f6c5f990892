"""``python -m gpusched.sim.preemption_search``: choose the preemptor's values by their effect
on dynamic runs, on one range of seeds, and check them on another.

For each seed of the synthetic workload, the defaults run once without a preemptor and
once per candidate value of the preemptor's rules; each candidate is judged against the
run without a preemptor on the goals the preemptor is held to:

* **served**: the work the preemptor serves waits less on average than without a
  preemptor: each class it preempted for that none of its preemptions took victims from
  (a class that is both gives as well as takes, and is held by the JCT goal), and, when
  it reclaimed, the jobs that arrived within their team's guarantee (``served``: the
  worst of those ratios; below 1 is better). A class whose mean waits differ by less than
  one scheduling cycle (``CYCLE_S``) is left out: the simulator decides once a cycle, so
  it resolves no finer (serving jobs wait about one cycle with or without a preemptor);
* **JCT**: the mean job completion time of all jobs is at most 10 % above (``jct``);
* **lost**: the GPU-hours preemption lost are under 1 % of the capacity over the arrivals
  (``lost``).

A candidate is a ``+``-joined list of the simulator's preemption flags
(``gpusched.sim.dynamic_configs.PREEMPTION_RULES``), e.g. ``loss-per-wait=0.02+min-runtime=300``.
The table gives each candidate's ratios per seed and their mean, and whether every seed
met every goal. Runs go to ``--jobs`` worker processes.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from multiprocessing import Pool
from statistics import mean

from gpusched.sim import figures
from gpusched.sim.dynamic import DynamicSimulator
from gpusched.sim.dynamic_configs import parse_config, split_preemption_rules
from gpusched.sim.metrics import summarize
from gpusched.sim.synthetic import synthetic_workload

BASE = "defaults+quotas"
CYCLE_S = 10.0    # the simulator's cycle interval (virtual seconds)
JCT_BOUND = 1.10
LOST_BOUND = 0.01


def run(seed: int, candidate: str | None, horizon_h: float = 48.0) -> dict:
    """The summary of the defaults on ``seed`` with the preemptor's rules of ``candidate``
    (None: no preemptor)."""
    wl = synthetic_workload(seed, horizon_h * 3600)
    text = BASE + (f"+{candidate}" if candidate else "")
    base, rules = split_preemption_rules(text)
    _, config = parse_config(base, wl.quotas, 3600.0, 6 * 3600.0)
    result = DynamicSimulator(wl, config, text, cycle_interval_s=CYCLE_S, preemption=candidate is not None,
                              preemption_rules=rules).run()
    return summarize(result)


def _run(args: tuple) -> tuple[int, str | None, dict]:
    seed, candidate, horizon_h, out = args
    path = out / f"seed{seed}-h{horizon_h:g}-{candidate or 'no-preemption'}.json"
    if path.exists():
        return seed, candidate, json.loads(path.read_text())
    summary = run(seed, candidate, horizon_h)
    path.write_text(json.dumps(summary))
    return seed, candidate, summary


def judge(with_: dict, without: dict) -> dict[str, float]:
    """The goals' ratios of a run with a preemptor against the run without one."""
    served = []
    victims = {r["victim_class"] for r in with_["preemptions_by"]}
    for cls in sorted({r["for_class"] for r in with_["preemptions_by"]} - victims):
        a, b = with_["classes"][cls]["mean"], without["classes"][cls]["mean"]
        if a is not None and b and abs(a - b) >= CYCLE_S:
            served.append(a / b)
    a, b = with_["within_guarantee_wait_s"]["mean"], without["within_guarantee_wait_s"]["mean"]
    if any(r["reason"] == "reclaim" for r in with_["preemptions_by"]) and a is not None and b:
        served.append(a / b)
    return {"served": max(served) if served else 1.0,
            "jct": with_["jct_s"]["mean"] / without["jct_s"]["mean"],
            "lost": with_["gpu_hours_lost"] / with_["capacity_gpu_hours"]}


def met(ratios: dict[str, float]) -> bool:
    return ratios["served"] < 1.0 and ratios["jct"] <= JCT_BOUND and ratios["lost"] < LOST_BOUND


def seeds_of(text: str) -> list[int]:
    """``1-3`` or ``1,5,9``."""
    if "-" in text:
        first, last = text.split("-")
        return list(range(int(first), int(last) + 1))
    return [int(s) for s in text.split(",")]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gpusched.sim.preemption_search", description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="1-3", help="synthetic seeds, e.g. 1-3 or 10,11 (default 1-3)")
    p.add_argument("--candidates", default="loss-per-wait=0.01,loss-per-wait=0.02,loss-per-wait=0.03",
                   help="comma-separated candidates, each a +-joined list of preemption flags")
    p.add_argument("--horizon-h", type=float, default=48.0, help="hours of arrivals")
    p.add_argument("--jobs", type=int, default=2, help="worker processes")
    p.add_argument("--publish", type=Path, metavar="FOLDER",
                   help="also write the table to FOLDER/preemption-search-seeds-<seeds>.json and .md (the "
                        "published figures: docs/figures)")
    p.add_argument("--out", type=Path, default=Path("results/preemption_search"),
                   help="each run's summary, read back instead of running it again when there (delete the "
                        "folder after changing the code)")
    args = p.parse_args(argv)
    seeds, candidates = seeds_of(args.seeds), args.candidates.split(",")
    args.out.mkdir(parents=True, exist_ok=True)
    work = [(seed, c, args.horizon_h, args.out) for seed in seeds for c in [None, *candidates]]
    with Pool(args.jobs) as pool:
        done = {(seed, c): s for seed, c, s in pool.imap_unordered(_run, work)}
    lines = [f"Defaults with the preemptor against without, synthetic seeds {args.seeds}, {args.horizon_h:g} h. "
             f"served: the mean wait of the classes preempted for and never from, and of work within guarantees "
             f"(the worst ratio), goal < 1; JCT: the mean job completion time's ratio, goal <= {JCT_BOUND:g}; "
             f"lost: GPU-hours lost as a share of the capacity over the arrivals, goal < {LOST_BOUND:.0%}.", "",
             "| candidate | " + " | ".join(f"seed {s} served / JCT / lost" for s in seeds) + " | mean | every goal |",
             "|---|" + "---:|" * (len(seeds) + 2)]
    results = {}
    for c in candidates:
        ratios = [judge(done[(s, c)], done[(s, None)]) for s in seeds]
        cells = [f"{r['served']:.2f} / {r['jct']:.3f} / {r['lost']:.2%}" for r in ratios]
        avg = {k: mean(r[k] for r in ratios) for k in ratios[0]}
        every = all(met(r) for r in ratios)
        results[c] = {"ratios": dict(zip(map(str, seeds), ratios)), "mean": avg, "every_goal": every}
        lines.append(f"| {c} | " + " | ".join(cells) + f" | {avg['served']:.2f} / {avg['jct']:.3f} / "
                     f"{avg['lost']:.2%} | {'yes' if every else 'no'} |")
    print("\n".join(lines))
    if args.publish:
        command = figures.command_line("python -m gpusched.sim.preemption_search", argv)
        name = f"preemption-search-seeds-{args.seeds.replace(',', '_')}"
        for path in figures.publish(args.publish, name, command, {"seeds": seeds, "candidates": results},
                                    "\n".join(lines)):
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
