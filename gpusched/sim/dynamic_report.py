"""Reports of dynamic runs: a table, JSON and CSV files, and two plots.

Files go under ``<out>/<workload>/``: ``summary.json`` (every figure, per team too, with
the workload's description and the command line), ``summary.csv`` (one row per
configuration), ``table.md`` (the tables printed on stdout: overall, per team, per priority class, waits by
job size, preemptions by reason and class; on a topology, how compact the gangs' placements
were and their waits by size), ``utilization.png`` (GPU allocation and queue length over
time) and ``team_shares.png`` (GPUs each team held).
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

from gpusched.sim.metrics import SimResult

COLUMNS = (
    ("config", "config", "{}"),
    ("alloc", "gpu_allocation", "{:.1%}"),
    ("alloc saturated", "gpu_allocation_saturated", "{:.1%}"),
    ("wait mean", ("queueing_delay_s", "mean"), "{:,.0f}"),
    ("wait p50", ("queueing_delay_s", "p50"), "{:,.0f}"),
    ("wait p99", ("queueing_delay_s", "p99"), "{:,.0f}"),
    ("≥8-GPU wait mean", ("large_delay_s", "mean"), "{:,.0f}"),
    ("≥8-GPU wait max", ("large_delay_s", "max"), "{:,.0f}"),
    ("JCT mean", ("jct_s", "mean"), "{:,.0f}"),
    ("JCT p50", ("jct_s", "p50"), "{:,.0f}"),
    ("JCT p99", ("jct_s", "p99"), "{:,.0f}"),
    ("Jain", "jain_backlogged", "{:.3f}"),
    ("frag", "fragmentation", "{:.1%}"),
    ("never ran", "never_ran", "{}"),
    ("backfilled", "backfilled", "{}"),
    ("run s", "wall_s", "{:.0f}"),
)


def _get(summary: dict, key):
    if isinstance(key, tuple):
        return summary[key[0]][key[1]]
    return summary[key]


def _cell(summary: dict, key, fmt: str) -> str:
    value = _get(summary, key)
    return "-" if value is None else fmt.format(value)


def table(summaries: list[dict]) -> str:
    """A markdown table: times in seconds. A column whose figure the summaries lack (the
    wall time, which published summaries leave out) is left out."""
    columns = [c for c in COLUMNS if not summaries or isinstance(c[1], tuple) or c[1] in summaries[0]]
    head = "| " + " | ".join(name for name, _, _ in columns) + " |"
    rule = "|" + "|".join("---" if i == 0 else "---:" for i in range(len(columns))) + "|"
    rows = ["| " + " | ".join(_cell(s, key, fmt) for _, key, fmt in columns) + " |" for s in summaries]
    return "\n".join([head, rule, *rows])


def size_table(summaries: list[dict]) -> str:
    """Worst and p99 waits by job size (seconds), with the figures starvation is judged
    by beside them: Jain's index, allocation, preemptions, GPU-hours lost."""
    sizes = list(summaries[0]["waits_by_size"]) if summaries else []
    head = ("| config | " + " | ".join(f"{s} worst / p99" for s in sizes)
            + " | never ran | Jain | alloc | alloc saturated | preemptions | GPU-h lost |")
    rule = "|---|" + "---:|" * (len(sizes) + 6)

    def number(value, fmt="{:,.0f}"):
        return "-" if value is None else fmt.format(value)
    rows = []
    for s in summaries:
        waits = [f"{number(b['max'])} / {number(b['p99'])}" for b in s["waits_by_size"].values()]
        rows.append(f"| {s['config']} | " + " | ".join(waits) + f" | {s['never_ran']} | "
                    f"{number(s['jain_backlogged'], '{:.3f}')} | {number(s['gpu_allocation'], '{:.1%}')} | "
                    f"{number(s['gpu_allocation_saturated'], '{:.1%}')} | {s['preemptions']} | "
                    f"{s['gpu_hours_lost']:,.0f} |")
    return "\n".join([head, rule, *rows])


def team_table(summaries: list[dict]) -> str:
    """Per team: mean GPUs held over the arrival window and mean wait, per configuration."""
    teams = list(summaries[0]["teams"]) if summaries else []
    head = "| config | " + " | ".join(f"{t} GPUs / wait s" for t in teams) + " |"
    rule = "|---|" + "---:|" * len(teams)
    rows = []
    for s in summaries:
        cells = []
        for t in teams:
            team = s["teams"][t]
            wait = team["wait_s"]["mean"]
            cells.append(f"{team['mean_gpus']:.0f} / {'-' if wait is None else f'{wait:,.0f}'}")
        rows.append(f"| {s['config']} | " + " | ".join(cells) + " |")
    return "\n".join([head, rule, *rows])


def class_table(summaries: list[dict]) -> str:
    """Per priority class, and for the jobs that arrived within their team's guarantee: mean
    and p99 wait (seconds), per configuration."""
    classes = list(summaries[0]["classes"]) if summaries else []
    head = ("| config | " + " | ".join(f"{c} wait mean / p99" for c in classes)
            + " | within guarantee wait mean / p99 |")
    rule = "|---|" + "---:|" * (len(classes) + 1)

    def cell(stats):
        return " / ".join("-" if stats[k] is None else f"{stats[k]:,.0f}" for k in ("mean", "p99"))
    rows = [f"| {s['config']} | " + " | ".join(cell(s["classes"][c]) for c in classes)
            + f" | {cell(s['within_guarantee_wait_s'])} |" for s in summaries]
    return "\n".join([head, rule, *rows])


def preemption_table(summaries: list[dict]) -> str:
    """Each configuration's victims by reason and classes (victim -> beneficiary): how many,
    GPU-hours lost (and their share of the capacity over the arrivals), median work lost
    per victim, victims already preempted before."""
    head = "| config | reason | victim -> for | victims | GPU-h lost | of capacity | median lost GPU-s | again |"
    rule = "|---|---|---|---:|---:|---:|---:|---:|"
    rows = []
    for s in summaries:
        capacity = s["capacity_gpu_hours"] or 1.0
        rows.append(f"| {s['config']} | all | | {s['preemptions']} | {s['gpu_hours_lost']:,.0f} | "
                    f"{s['gpu_hours_lost'] / capacity:.2%} | | |")
        for r in s["preemptions_by"]:
            rows.append(f"| | {r['reason']} | {r['victim_class']} -> {r['for_class']} | {r['victims']} | "
                        f"{r['gpu_hours_lost']:,.0f} | {r['gpu_hours_lost'] / capacity:.2%} | "
                        f"{r['median_lost_gpu_s']:,.0f} | {r['again']} |")
    return "\n".join([head, rule, *rows])


def write(out: Path, workload_note: str, command: str, summaries: list[dict]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(
        {"workload": workload_note, "command": command, "results": summaries}, indent=2))
    flat = [{name: _get(s, key) for name, key, _ in COLUMNS} for s in summaries]
    with open(out / "summary.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[name for name, _, _ in COLUMNS])
        writer.writeheader()
        writer.writerows(flat)
    (out / "table.md").write_text("\n\n".join(tables(summaries)) + "\n")


def tables(summaries: list[dict]) -> list[str]:
    """Every table of a run, in the order printed (the services' last, when services ran)."""
    out = [table(summaries), team_table(summaries), class_table(summaries), size_table(summaries),
           preemption_table(summaries)]
    if any("services" in s for s in summaries):
        out.append(service_table([s for s in summaries if "services" in s]))
    if any("topology" in s for s in summaries):
        mine = [s for s in summaries if "topology" in s]
        out += [topology_table(mine), topology_size_table(mine)]
    return out


def _number(value, fmt="{:,.0f}") -> str:
    return "-" if value is None else fmt.format(value)


def _gang_sizes(summaries: list[dict]) -> list[str]:
    return sorted({size for s in summaries for size in s["topology"]["by_size"]}, key=float)


def topology_table(summaries: list[dict]) -> str:
    """Runs on a topology (``gpusched.sim.topology``): of the multi-node gangs' placements,
    the share within one domain of each level (bottom up: one block, one rack); the gangs'
    mean / p99 wait (seconds) by size in GPUs, and every other job's; allocation, mean JCT."""
    levels = list(reversed(summaries[0]["topology"]["levels"])) if summaries else []
    sizes = _gang_sizes(summaries)
    head = ("| config | gang placements | " + " | ".join(f"within one {lv}" for lv in levels) + " | "
            + " | ".join(f"{size}-GPU gang wait mean / p99" for size in sizes)
            + " | other jobs wait mean / p99 | alloc | JCT mean |")
    rule = "|---|" + "---:|" * (1 + len(levels) + len(sizes) + 3)
    rows = []
    for s in summaries:
        t = s["topology"]

        def waits(w):
            return f"{_number(w['mean'])} / {_number(w['p99'])}"
        cells = [str(t["placements"])] + [_number(t[f"within_one_{lv}"], "{:.1%}") for lv in levels]
        cells += [waits(t["by_size"][size]["wait_s"]) if size in t["by_size"] else "-" for size in sizes]
        cells += [waits(t["other_jobs_wait_s"]), _number(s["gpu_allocation"], "{:.1%}"),
                  _number(s["jct_s"]["mean"])]
        rows.append(f"| {s['config']} | " + " | ".join(cells) + " |")
    return "\n".join([head, rule, *rows])


def topology_size_table(summaries: list[dict]) -> str:
    """The multi-node gangs by size (GPUs): how many, their placements, the share within
    one domain of each level, never ran."""
    levels = list(reversed(summaries[0]["topology"]["levels"])) if summaries else []
    head = ("| config | gang GPUs | gangs | placements | " + " | ".join(f"within one {lv}" for lv in levels)
            + " | never ran |")
    rule = "|---|---:|" + "---:|" * (3 + len(levels))
    rows = []
    for s in summaries:
        for size, b in s["topology"]["by_size"].items():
            rows.append(f"| {s['config']} | {size} | {b['jobs']} | {b['placements']} | "
                        + " | ".join(_number(b[f"within_one_{lv}"], "{:.1%}") for lv in levels)
                        + f" | {b['never_ran']} |")
    return "\n".join([head, rule, *rows])


def service_table(summaries: list[dict]) -> str:
    """Services beside the jobs (``gpusched.sim.serving``): availability (ready >= what the
    load needs; and ready >= desired), scale-up latency (seconds), and what training got:
    GPU-hours lost to preemptions for replicas, GPU-hours it held over the service window,
    its mean JCT and jobs that never ran."""
    head = ("| config | split | services | availability | ready >= desired | scale-up p50 / p99 / max | "
            "training GPU-h lost to replicas | victims | training GPU-h in window | training JCT mean | never ran |")
    rule = "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"

    def number(value, fmt="{:,.0f}"):
        return "-" if value is None else fmt.format(value)
    rows = []
    for s in summaries:
        v, lat = s["services"], s["services"]["scale_up_latency_s"]
        rows.append(f"| {s['config']} | {v['split']} | {v['services']} | {number(v['availability'], '{:.1%}')} | "
                    f"{number(v['availability_desired'], '{:.1%}')} | "
                    f"{number(lat['p50'])} / {number(lat['p99'])} / {number(lat['max'])} | "
                    f"{v['training_gpu_hours_lost_to_replicas']:,.1f} | {v['training_victims_of_replicas']} | "
                    f"{v['training_gpu_hours_in_window']:,.0f} | {number(s['jct_s']['mean'])} | {s['never_ran']} |")
    return "\n".join([head, rule, *rows])


def plot(out: Path, results: list[SimResult], until_s: float) -> list[Path]:
    """Utilization and per-team shares over ``[0, until_s]``, in hours."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    for r in results:
        t, alloc, pending = _series(r, until_s)
        top.step(t, [a / r.capacity_milli for a in alloc], where="post", label=r.label, lw=1)
        bottom.step(t, pending, where="post", label=r.label, lw=1)
    top.set_ylabel("GPU allocation")
    top.set_ylim(0, 1.02)
    top.legend(loc="lower right", fontsize=8)
    bottom.set_ylabel("jobs waiting")
    bottom.set_xlabel("hours")
    fig.suptitle(results[0].workload)
    fig.tight_layout()
    utilization = out / "utilization.png"
    fig.savefig(utilization, dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(len(results), 1, figsize=(10, 2.4 * len(results)), sharex=True, squeeze=False)
    for ax, r in zip(axes[:, 0], results):
        t, _, _ = _series(r, until_s)
        stacks = [[s.team_milli[i] / 1000 for s in _samples(r, until_s)] for i in range(len(r.teams))]
        ax.stackplot(t, stacks, labels=r.teams, step="post")
        ax.axhline(r.capacity_milli / 1000, color="black", lw=0.8, ls="--")
        ax.set_ylabel("GPUs")
        ax.set_title(r.label, fontsize=9)
    axes[0, 0].legend(loc="upper right", fontsize=7, ncol=len(results[0].teams))
    axes[-1, 0].set_xlabel("hours")
    fig.tight_layout()
    shares = out / "team_shares.png"
    fig.savefig(shares, dpi=110)
    plt.close(fig)
    return [utilization, shares]


# Plotting every sample of a long run gives megabyte PNGs and no more information.
_MAX_POINTS = 4000


def _samples(r: SimResult, until_s: float):
    samples = [s for s in r.samples if s.time <= until_s]
    step = max(1, len(samples) // _MAX_POINTS)
    return samples[::step]


def _series(r: SimResult, until_s: float):
    samples = _samples(r, until_s)
    return ([s.time / 3600 for s in samples], [s.allocated_milli for s in samples], [s.pending for s in samples])
