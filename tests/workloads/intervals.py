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
