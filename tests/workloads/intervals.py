"""Reading ``recorder.py``'s records back as intervals of GPU use, and finding two
attempts (or jobs) that ever used one GPU at the same time.

An interval runs from a process's start record to its end record, or to its last tick
when it recorded no end (SIGKILL): that understates a killed process's life by at most
one tick, which a check must allow for.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, NamedTuple


class Interval(NamedTuple):
    gpu: str                 # GPU uuid, one of CUDA_VISIBLE_DEVICES
    job: str | None
    attempt: int | None
    worker: int | None
    start: float
    last_seen: float


def _files(paths_or_dir: str | Path | Iterable[str | Path]) -> list[Path]:
    items = [paths_or_dir] if isinstance(paths_or_dir, (str, Path)) else list(paths_or_dir)
    files: list[Path] = []
    for item in map(Path, items):
        files.extend(sorted(item.rglob("*.jsonl")) if item.is_dir() else [item])
    return files


def _runs(path: Path) -> list[dict]:
    """One entry per process start in the file, with its last sign of life."""
    runs: list[dict] = []
    current: dict[int, dict] = {}        # pid -> its latest run (a file may hold several)
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
            event, t = rec["event"], float(rec["t"])
        except (ValueError, KeyError, TypeError):
            continue                     # a line cut short: skip it
        if event == "start":
            current[rec.get("pid")] = started = {**rec, "last_seen": t}
            runs.append(started)
        elif (run := current.get(rec.get("pid"))) is not None:
            run["last_seen"] = max(run["last_seen"], t)
    return runs


def read_records(paths_or_dir: str | Path | Iterable[str | Path]) -> list[Interval]:
    """Every GPU interval recorded in the given files, or in the ``*.jsonl`` under a folder."""
    out = []
    for path in _files(paths_or_dir):
        for run in _runs(path):
            for gpu in filter(None, (g.strip() for g in (run.get("gpus") or "").split(","))):
                out.append(Interval(gpu, run.get("job"), run.get("attempt"), run.get("worker"),
                                    float(run["t"]), run["last_seen"]))
    return sorted(out, key=lambda i: (i.start, i.gpu))


def lost_gpu_seconds(paths_or_dir: str | Path | Iterable[str | Path]) -> float:
    """Work the faults cost, in GPU-seconds: for each worker run that a later attempt of
    its job replaced, its time alive less the progress the next attempt resumed from
    beyond where this one started (what its checkpoints kept), times its GPUs."""
    runs: dict[tuple, list[dict]] = {}
    for path in _files(paths_or_dir):
        for run in _runs(path):
            if run.get("job") is not None and run.get("attempt") is not None:
                runs.setdefault((run["job"], run.get("worker")), []).append(run)
    lost = 0.0
    for attempts in runs.values():
        attempts.sort(key=lambda r: (r["attempt"], float(r["t"])))
        for run, after in zip(attempts, attempts[1:]):
            kept = float(after.get("resumed_from") or 0.0) - float(run.get("resumed_from") or 0.0)
            gpus = len([g for g in (run.get("gpus") or "").split(",") if g.strip()]) or 1
            lost += max(0.0, run["last_seen"] - float(run["t"]) - max(0.0, kept)) * gpus
    return lost


def overlaps(intervals: Iterable[Interval]) -> list[tuple[Interval, Interval]]:
    """Pairs of intervals of different attempts (or jobs) on one GPU that overlap in
    time (touching ends do not count); each pair earlier-started first."""
    by_gpu: dict[str, list[Interval]] = {}
    for i in intervals:
        by_gpu.setdefault(i.gpu, []).append(i)
    found = []
    for gpu in sorted(by_gpu):
        ordered = sorted(by_gpu[gpu], key=lambda i: (i.start, i.last_seen))
        for n, a in enumerate(ordered):
            for b in ordered[n + 1:]:
                if b.start >= a.last_seen:
                    break
                if (a.job, a.attempt) != (b.job, b.attempt):
                    found.append((a, b))
    return found


def over_capacity(intervals: Iterable[Interval], milli_of: dict[str, int]) -> list[str]:
    """Moments when the processes alive on one GPU asked more than the whole GPU: each
    interval counts its job's GPU milli (``milli_of[job]``: 1000 for a whole GPU, the
    share, or a MIG slice's), so shares and slices may overlap, whole GPUs may not."""
    by_gpu: dict[str, list[Interval]] = {}
    for i in intervals:
        by_gpu.setdefault(i.gpu, []).append(i)
    found = []
    for gpu, items in sorted(by_gpu.items()):
        for i in items:
            alive = [j for j in items if j.start <= i.start < j.last_seen]
            load = sum(milli_of.get(j.job, 1000) for j in alive)
            if load > 1000:
                found.append(f"{gpu} at {i.start:.3f}: {load} milli alive "
                             f"({', '.join(f'{j.job}/{j.attempt}' for j in alive)})")
    return found


def attempts_overlap(intervals: Iterable[Interval]) -> list[tuple[tuple, tuple]]:
    """Two attempts of one job alive at once, on any GPUs: the split brain that fencing
    prevents. Each attempt spans its workers' first start to their last sign of life."""
    spans: dict[tuple, tuple[float, float]] = {}
    for i in intervals:
        start, end = spans.get((i.job, i.attempt), (i.start, i.last_seen))
        spans[(i.job, i.attempt)] = (min(start, i.start), max(end, i.last_seen))
    found = []
    for (job, a), (s1, e1) in spans.items():
        for (job2, b), (s2, e2) in spans.items():
            if job == job2 and a is not None and b is not None and a < b and s2 < e1 and s1 < e2:
                found.append(((job, a, s1, e1), (job2, b, s2, e2)))
    return found


def with_shim_ends(root: str | Path, intervals: Iterable[Interval]) -> list[Interval]:
    """Each interval extended to the end its worker's shim recorded after reaping it
    (``shim.json`` beside the record): a SIGKILLed workload's last tick understates its
    life by up to one tick, the shim's record does not."""
    ends: dict[tuple, float] = {}
    for status_file in Path(root).rglob("shim.json"):
        try:
            status = json.loads(status_file.read_text())
        except ValueError:
            continue
        record = status_file.with_name("record.jsonl")
        if status.get("ended_at") and record.exists():
            for run in _runs(record):
                if run.get("pid") == status.get("pid"):
                    ends[(run.get("job"), run.get("attempt"), run.get("worker"), float(run["t"]))] = \
                        float(status["ended_at"])
    return [i._replace(last_seen=max(i.last_seen, ends.get((i.job, i.attempt, i.worker, i.start), i.last_seen)))
            for i in intervals]
