"""Tables, result files and plots of static packing runs (``gpusched.sim.static``)."""
from __future__ import annotations

import csv
import json
from pathlib import Path
from statistics import mean, stdev
from typing import Iterable, Protocol, Sequence

# The paper simulator's expected results (GPU allocation ratio at 130 % arrived, %, mean
# of 10 seeds), as the trace folder's README lists them; by our policy names.
PUBLISHED: dict[str, dict[str, float]] = {
    "default":    {"random": 87.47, "dot-product": 90.85, "gpu-clustering": 91.88,
                   "gpu-packing": 92.00, "best-fit": 93.08, "fgd": 95.39},
    "cpu050":     {"random": 91.24, "dot-product": 93.27, "gpu-clustering": 93.79,
                   "gpu-packing": 93.72, "best-fit": 93.79, "fgd": 95.21},
    "gpushare40": {"random": 86.00, "dot-product": 89.56, "gpu-clustering": 90.02,
                   "gpu-packing": 90.03, "best-fit": 91.69, "fgd": 94.15},
    "multigpu20": {"random": 88.69, "dot-product": 92.06, "gpu-clustering": 93.56,
                   "gpu-packing": 93.71, "best-fit": 93.93, "fgd": 95.65},
    "gpuspec10":  {"random": 87.43, "dot-product": 90.39, "gpu-clustering": 92.18,
                   "gpu-packing": 92.46, "best-fit": 93.30, "fgd": 94.95},
}
BASELINE = "fgd"


class RunLike(Protocol):
    pod_list: str
    policy: str
    seed: int
    curve: list[float]
    seconds: float

    @property
    def final(self) -> float: ...


def finals(runs: Iterable[RunLike], pod_list: str, policy: str) -> list[float]:
    return [100 * r.final for r in sorted(runs, key=lambda r: r.seed) if r.pod_list == pod_list and r.policy == policy]


def table(runs: Sequence[RunLike], lists: Sequence[str], policies: Sequence[str]) -> str:
    """Mean allocation ratio at 130 % per list and policy, published value in brackets;
    the last column is our policy's lead over FGD (mean, and seeds won)."""
    ours = [p for p in policies if p not in PUBLISHED[lists[0]]]
    head = ["pod list"] + list(policies) + [f"{p} - {BASELINE}" for p in ours if BASELINE in policies]
    rows = [head]
    for pod_list in lists:
        row = [pod_list]
        for policy in policies:
            values = finals(runs, pod_list, policy)
            published = PUBLISHED[pod_list].get(policy)
            cell = f"{mean(values):.2f}" if values else "-"
            row.append(cell + (f" ({published:.2f})" if published is not None else ""))
        for policy in ours:
            if BASELINE in policies:
                a, b = finals(runs, pod_list, policy), finals(runs, pod_list, BASELINE)
                wins = sum(x > y for x, y in zip(a, b))
                row.append(f"{mean(a) - mean(b):+.2f} ({wins}/{len(a)} seeds)")
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return ("GPU allocation ratio at 130 % arrived GPU request, % (mean of seeds; published in brackets)\n"
            + "\n".join(lines))


def summary(runs: Sequence[RunLike], lists: Sequence[str], policies: Sequence[str]) -> dict:
    """Per list and policy: the mean, spread and per-seed ratios at 130 % (%), and the
    paper's published value."""
    return {
        pod_list: {policy: {"mean": mean(v), "stdev": stdev(v) if len(v) > 1 else 0.0, "seeds": v,
                            "published": PUBLISHED[pod_list].get(policy)}
                   for policy in policies if (v := finals(runs, pod_list, policy))}
        for pod_list in lists
    }


def figures(runs: Sequence[RunLike], lists: Sequence[str], policies: Sequence[str]) -> dict:
    """The headline figures as published (``gpusched.sim.figures``): the seeds run, in
    order, and ``summary``."""
    return {"seeds": sorted({r.seed for r in runs}), "summary": summary(runs, lists, policies)}


def write(runs: Sequence[RunLike], lists: Sequence[str], policies: Sequence[str], out: Path,
          wall_s: float) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    doc = {"method": "gpusched.sim.static", "wall_s": wall_s, "summary": summary(runs, lists, policies),
           "runs": [{"pod_list": r.pod_list, "policy": r.policy, "seed": r.seed, "seconds": r.seconds,
                     "curve": r.curve} for r in runs]}
    paths = [out / "static.json", out / "static.csv"]
    paths[0].write_text(json.dumps(doc, indent=1))
    with open(paths[1], "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["pod_list", "policy", "seed", "ratio_at_130_pct"])
        for r in sorted(runs, key=lambda r: (r.pod_list, r.policy, r.seed)):
            writer.writerow([r.pod_list, r.policy, r.seed, f"{100 * r.final:.4f}"])
    return paths + plot(runs, lists, policies, out)


def plot(runs: Sequence[RunLike], lists: Sequence[str], policies: Sequence[str], out: Path) -> list[Path]:
    """One PNG per pod list: mean allocation ratio against arrived GPU request."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for pod_list in lists:
        fig, (whole, tail) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [3, 2]})
        for policy in policies:
            curves = [r.curve for r in runs if r.pod_list == pod_list and r.policy == policy]
            if not curves:
                continue
            points = range(len(curves[0]))
            avg = [100 * mean(c[i] for c in curves) for i in points]
            for ax in (whole, tail):
                ax.plot(list(points), avg, label=policy, linewidth=1.4)
        whole.plot([0, 100], [0, 100], color="grey", linewidth=0.6, linestyle=":")
        tail.set_xlim(80, 130)
        tail.set_ylim(80, 100)
        for ax in (whole, tail):
            ax.set_xlabel("arrived GPU request, % of cluster GPUs")
            ax.grid(alpha=0.3)
        whole.set_ylabel("GPU allocation ratio, %")
        whole.set_title(f"openb {pod_list}: static packing")
        tail.set_title("80-130 %")
        tail.legend(fontsize=8, loc="lower right")
        fig.tight_layout()
        path = out / f"alloc_{pod_list}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths
