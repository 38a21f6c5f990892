"""Work left running from an earlier life of the agent: found, and ended unless the
restarted agent takes it over.

``find_leftovers`` goes through the worker folders under the agent's state folder and
returns every worker whose shim status records no end. The agent adopts those the log
still runs on this node and whose shim is alive (``Leftover.adoptable``; ``agent.py``);
it must not let any other run on: the scheduler has placed (or will place) that work
elsewhere. ``end_leftovers`` stops those: through the shim when it is alive (the shim
records the real end), or directly when only the workload is left, and returns once
the processes are really gone, with each worker's end.

Worker folders are named ``<job_id>-<attempt>-<worker>`` (``worker_dir_name``); the job
id may itself contain dashes, the two numbers may not.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, NamedTuple

from gpusched.core.model import EXIT_LOST
from gpusched_node_agent.runner import (STATUS_FILE, WorkerExit, check_seconds, exit_from_status, group_alive,
                                        read_status)
from gpusched_node_agent.proc_info import boot_id, proc_stat

log = logging.getLogger("gpusched.node_agent")
POLL_S = 0.02
MARGIN_S = 3.0     # past kill-wait, before the agent SIGKILLs what a shim did not end
# Whether any process of a group is still running: the one probe of "gone" (a process in
# uninterruptible sleep outlives SIGKILL, which no test can make on purpose).
GroupAlive = Callable[[int], bool]


class WorkerDir(NamedTuple):
    job_id: str
    attempt: int
    worker: int


def worker_dir_name(job_id: str, attempt: int, worker: int) -> str:
    return f"{job_id}-{attempt}-{worker}"


def parse_worker_dir(name: str) -> WorkerDir:
    """``"<job_id>-<attempt>-<worker>"`` -> WorkerDir; ValueError naming the bad part."""
    rest, _, worker = name.rpartition("-")
    job_id, _, attempt = rest.rpartition("-")
    if not job_id:
        raise ValueError(f"worker dir {name!r}: expected <job_id>-<attempt>-<worker>")
    for field, text in (("attempt", attempt), ("worker", worker)):
        if not text.isdigit():
            raise ValueError(f"worker dir {name!r}: {field} {text!r} is not a non-negative integer")
    return WorkerDir(job_id, int(attempt), int(worker))


@dataclass(frozen=True)
class LeftoverWorker:
    name: str                  # the worker folder's name
    key: WorkerDir | None      # that name parsed; None when it does not follow the convention
    end: WorkerExit
    gone: bool = True          # False: a process was still there when the deadline passed


class Leftover:
    """One worker whose shim status records no end: adopted, or stopped here."""

    def __init__(self, path: Path, status: dict, group_alive: GroupAlive) -> None:
        self.path, self.status, self.group_alive = path, status, group_alive
        self.pid: int | None = _pid(status.get("pid"))
        self.via_shim = _same_process(status.get("shim_pid"), status.get("shim_start"))
        self.last_signal = 0
        self.kill_at = 0.0
        self.end: WorkerExit | None = None

    @property
    def key(self) -> WorkerDir | None:
        return _key(self.path.parent.name)

    @property
    def adoptable(self) -> bool:
        """Its shim is alive and started the workload: a restarted agent may take it over."""
        return self.via_shim and self.pid is not None and self.key is not None

    def alive(self) -> bool:
        return self.via_shim or (self.pid is not None and self.group_alive(self.pid))

    def begin(self, kill_wait: float) -> None:
        """SIGTERM: to the shim, which forwards it and keeps its own kill deadline; else
        to the workload's group, SIGKILLed by ``poll`` after ``kill_wait``."""
        self.kill_at = time.monotonic() + kill_wait
        if self.via_shim:
            _signal(os.kill, self.status["shim_pid"], signal.SIGTERM)
        else:
            self._group(signal.SIGTERM)

    def poll(self) -> bool:
        """True once this worker is over (its end then set)."""
        if self.via_shim:
            status = read_status(self.path) or {}
            shim_gone = not _same_process(self.status.get("shim_pid"), self.status.get("shim_start"))
            if "ended_at" in status:
                if shim_gone:            # its end recorded, and the shim itself is gone too
                    self.end = exit_from_status(status)
            elif shim_gone:              # the shim died without recording the end: go direct
                self.via_shim = False
                self._group(signal.SIGTERM)
            return self.end is not None
        if self.pid is not None and self.group_alive(self.pid):
            if self.last_signal != signal.SIGKILL and time.monotonic() >= self.kill_at:
                self._group(signal.SIGKILL)
            return False
        self._record(WorkerExit(128 + self.last_signal, self.last_signal,
                                reason=f"left over from an earlier agent; ended after {_name(self.last_signal)} "
                                       "from the agent (no shim to record its exit)"))
        return True

    def force(self) -> None:
        """The deadline passed: SIGKILL the workload's group and the shim."""
        self._group(signal.SIGKILL)
        if self.via_shim:
            _signal(os.kill, self.status["shim_pid"], signal.SIGKILL)
            self.via_shim = False

    def _group(self, sig: int) -> None:
        if self.pid is not None:
            _signal(os.killpg, self.pid, sig)
            self.last_signal = sig

    def _record(self, end: WorkerExit) -> None:
        """Write the end into the status, so the worker is not reported twice."""
        self.end = end
        _write_status(self.path, {**self.status, "ended_at": time.time(), "exit_code": None if end.signal else
                                  end.exit_code, "signal": end.signal, "fenced": False, "reason": end.reason})

    def lost(self, reason: str) -> None:
        self._record(WorkerExit(EXIT_LOST, 0, reason=reason))


def find_leftovers(state_dir: Path, alive: GroupAlive = group_alive) -> list[Leftover]:
    """Every worker under ``state_dir`` whose shim status records no end (``alive``:
    whether a process group still runs). Pids recorded in an earlier boot are never
    signalled (nor adopted)."""
    here = boot_id()
    found = []
    for path in sorted(Path(state_dir).glob(f"*/{STATUS_FILE}")):
        status = read_status(path)
        if status is None:
            log.warning("unreadable worker status %s: skipped", path)
            continue
        if "ended_at" in status:
            continue
        w = Leftover(path, status, alive)
        if status.get("boot_id") and here and status["boot_id"] != here:
            w.pid = None          # its pids belong to an earlier boot: never signal them
            w.via_shim = False
        found.append(w)
    return found


def end_leftovers(found: list[Leftover], kill_wait: float) -> list[LeftoverWorker]:
    """End the workers ``found``; wait (polling, up to ``kill_wait`` + a margin, then
    SIGKILL and a margin more) until their processes are gone. Each one is returned with
    its end, ``gone=False`` where a process outlived SIGKILL (its end is not recorded:
    the next agent looks again)."""
    check_seconds("kill_wait", kill_wait)
    live = [w for w in found if w.alive()]
    for w in found:
        if w not in live:
            w.lost("gone before the agent came back (node rebooted or shim killed): end unknown")
    for w in live:
        w.begin(kill_wait)
    pending = _wait(live, time.monotonic() + kill_wait + MARGIN_S)
    for w in pending:
        w.force()
    stuck = _wait(pending, time.monotonic() + MARGIN_S)
    for w in stuck:
        log.error("worker %s is still there after SIGKILL", w.path.parent.name)
        w.end = WorkerExit(128 + signal.SIGKILL, signal.SIGKILL, reason="still there after SIGKILL")
    return [LeftoverWorker(w.path.parent.name, w.key, w.end, w not in stuck) for w in found]


def kill_leftovers(state_dir: Path, kill_wait: float, alive: GroupAlive = group_alive) -> list[LeftoverWorker]:
    """End every worker under ``state_dir`` whose shim status records no end."""
    check_seconds("kill_wait", kill_wait)
    return end_leftovers(find_leftovers(state_dir, alive), kill_wait)


def _wait(workers: list[Leftover], deadline: float) -> list[Leftover]:
    """Poll until every worker is over or the deadline passes; those still pending."""
    pending = list(workers)
    while pending:
        pending = [w for w in pending if not w.poll()]
        if not pending or time.monotonic() >= deadline:
            break
        time.sleep(POLL_S)   # other processes' state: polled, with the deadline above
    return pending


def _pid(value) -> int | None:
    """A pid fit to signal: never 0, 1 or negative, which kill() reads as whole groups."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 1 else None


def _same_process(pid, started) -> bool:
    """``pid`` is alive and is the process recorded (not a later one with its pid)."""
    if _pid(pid) is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    stat = proc_stat(pid)
    if stat is None:           # gone meanwhile, or no /proc to tell (then: alive)
        return not os.path.isdir("/proc/self")
    state, start = stat
    return state not in "ZX" and (started is None or start == started)


def _write_status(path: Path, status: dict) -> None:
    """Replace the status file atomically (as the shim does): a reader sees the old or the new."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(status))
    os.replace(tmp, path)


def _signal(send, pid: int, sig: int) -> None:
    try:
        send(pid, sig)
    except ProcessLookupError:
        pass


def _name(sig: int) -> str:
    return signal.Signals(sig).name if sig else "no signal"


def _key(name: str) -> WorkerDir | None:
    try:
        return parse_worker_dir(name)
    except ValueError:
        return None
