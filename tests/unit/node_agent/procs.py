"""Helpers for tests that run real worker processes: the shim, the recorder workload,
and reading back what they write (files, pids)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from gpusched_node_agent import shim_process
from gpusched_node_agent.runner import read_status
from tests.polling import eventually

REPO = Path(__file__).resolve().parents[3]
RECORDER = REPO / "tests" / "workloads" / "recorder.py"
GPU = "GPU-test-0"


def recorder(*args: str) -> list[str]:
    return [sys.executable, str(RECORDER), *args]


def start_shim(workdir: Path, command: list[str], *, lease: Path | None = None, kill_wait: float = 0.3,
               poll: float = 0.05, job: str = "job", attempt: int = 0) -> subprocess.Popen:
    """A shim as the agent starts it: own session, env with the worker's ids."""
    workdir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "GPUSCHED_RECORD": str(workdir / "record.jsonl"), "CUDA_VISIBLE_DEVICES": GPU,
           "GPUSCHED_JOB_ID": job, "GPUSCHED_ATTEMPT": str(attempt), "GPUSCHED_WORKER": "0"}
    return subprocess.Popen(shim_command(workdir, command, lease, kill_wait, poll), cwd=workdir, env=env,
                            start_new_session=True)


def start_orphan_shim(workdir: Path, command: list[str], *, lease: Path | None = None, kill_wait: float = 0.3,
                      poll: float = 0.05) -> dict:
    """A shim whose parent is gone, as an earlier life of the agent leaves one: started
    by a process that exits at once. Its status once it started the workload."""
    workdir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "GPUSCHED_RECORD": str(workdir / "record.jsonl"), "CUDA_VISIBLE_DEVICES": GPU,
           "GPUSCHED_JOB_ID": "job", "GPUSCHED_ATTEMPT": "0", "GPUSCHED_WORKER": "0",
           "GPUSCHED_CHECKPOINT_FILE": str(workdir / "checkpoint")}   # where ProcessRun reads it
    spawn = "import os, sys; os.posix_spawn(sys.argv[1], sys.argv[1:], os.environ, setsid=True)"
    subprocess.run([sys.executable, "-c", spawn, *shim_command(workdir, command, lease, kill_wait, poll)],
                   cwd=workdir, env=env, check=True)
    return eventually(lambda: (read_status(workdir / "shim.json") or {}).get("pid") and read_status(workdir / "shim.json"),
                      f"the shim in {workdir.name} to start its workload")


def shim_program() -> list[str]:
    """The shim, as a command line's start."""
    return [str(shim_process.BINARY)]


def shim_command(workdir: Path, command: list[str], lease: Path | None, kill_wait: float, poll: float) -> list[str]:
    return [*shim_program(), *(["--lease", str(lease)] if lease else []), "--kill-wait", str(kill_wait),
            "--poll", str(poll), "--status", str(workdir / "shim.json"), "--", *command]


def records(workdir: Path) -> list[dict]:
    try:
        lines = (workdir / "record.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in lines if line.strip()]


def events(workdir: Path, kind: str) -> list[dict]:
    return [r for r in records(workdir) if r["event"] == kind]


def ticking(workdir: Path) -> bool:
    return bool(events(workdir, "tick"))


def ended_status(workdir: Path) -> dict | None:
    status = read_status(workdir / "shim.json")
    return status if status is not None and "ended_at" in status else None


def pid_alive(pid: int) -> bool:
    """Alive and not a zombie (orphans here may never be reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return False
    return text[text.rindex(")") + 2:].split()[0] not in "ZX"
