"""Where gpusched's submit-to-start goes, stage by stage, for the jobs of a steady stream
(bench/peer_slurm.py prints it after each gpusched round).

Every stamp is one the system already leaves, no extra instrumentation (all clocks are
this machine's):

* ``sent``: the client's clock just before its ``SubmitJob`` call;
* ``accepted``: the job's ``submitted_at`` (admission's clock when it took the job);
* ``placed``: ``placed_at`` (the placer's ``JobPlaced``);
* ``forked``: the birth time of the worker's folder, which the shim the node-agent's
  launcher forked makes first (``launcher.py``): the agent has read the placement, its
  launcher has forked the shim;
* ``spawned``: ``started_at`` in the shim's status file: the shim the launcher forked has
  spawned the workload;
* ``stamp``: the workload's own record of its start;
* ``running``: the job's ``started_at``, the time of the agent's ``WorkerStarted`` (it has
  seen the shim's status file);
* ``exited``, ``ended``: then the end: ``ended_at`` in the shim's status file, and the
  job's ``ended_at`` (the agent's ``WorkerFinished``; until the log has it, the GPU stays
  held).
"""
from __future__ import annotations

import json
from pathlib import Path

STAGES = (("submit call", "sent", "accepted"), ("log -> placed", "accepted", "placed"),
          ("placed -> agent's shim forked", "placed", "forked"),
          ("shim forked -> workload spawned", "forked", "spawned"),
          ("spawned -> workload's stamp", "spawned", "stamp"), ("spawned -> agent's WorkerStarted", "spawned", "running"),
          ("total: sent -> workload's stamp", "sent", "stamp"),
          ("then: spawned -> shim saw the end", "spawned", "exited"), ("shim saw the end -> WorkerFinished", "exited", "ended"))


def birth_time(path: Path) -> float | None:
    """A file's creation time (statx's btime, through coreutils' stat: Python's os.stat
    has none on Linux); None where the file system keeps none."""
    import subprocess
    out = subprocess.run(["stat", "-c", "%.9W", str(path)], capture_output=True, text=True).stdout.strip()
    try:
        value = float(out)
    except ValueError:
        return None
    return value or None


def job_stamps(job, sent: float, stamp: float | None, agent_dirs: list[Path]) -> dict[str, float] | None:
    """The stamps of one job (a ``gpusched.v1.Job``), None when one is missing."""
    from gpusched.client import seconds
    name = f"{job.job_id}-{job.attempt}-0"
    folder = next((d / name for d in agent_dirs if (d / name).is_dir()), None)
    if folder is None or stamp is None:
        return None
    try:
        status = json.loads((folder / "shim.json").read_text())
    except (OSError, ValueError):
        return None
    stamps = {"sent": sent, "accepted": seconds(job.submitted_at), "placed": seconds(job.placed_at),
              "forked": birth_time(folder), "spawned": status.get("started_at"), "stamp": stamp,
              "running": seconds(job.started_at), "exited": status.get("ended_at"), "ended": seconds(job.ended_at)}
    return stamps if all(isinstance(v, float) and v > 0 for v in stamps.values()) else None


def breakdown(jobs, sent: dict[str, float], stamps: dict[str, float], work: Path, pct) -> list[str]:
    """Lines: p50 and p99 (ms; ``pct(values, q)``, the quantile) of each stage over the
    jobs of one stream."""
    agent_dirs = sorted(p for p in work.glob("agent-n*") if p.is_dir())
    rows = [s for j in jobs if j.job_id in sent
            if (s := job_stamps(j, sent[j.job_id], stamps.get(j.job_id), agent_dirs)) is not None]
    lines = [f"    stages over {len(rows)} jobs (ms):       p50      p99"]
    for label, start, end in STAGES:
        values = [1000 * (r[end] - r[start]) for r in rows]
        lines.append(f"    {label:34s} {pct(values, .5):8.1f} {pct(values, .99):8.1f}")
    return lines

