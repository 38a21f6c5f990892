"""Running one worker: a real process under its shim, with its devices
(``devices.WorkerDevices``), or a simulated run.

Both report checkpoints through ``on_checkpoint(location, progress_s)``, where
``progress_s`` is the job's total work done so far (seconds), so a resumed attempt
starts where the checkpoint left off and the log shows how much work a stop lost.
Both end with a ``WorkerExit``: the code, the signal and whether the lease fenced it.
"""
from __future__ import annotations

import asyncio
import json
import math
import os
import re
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Awaitable, Callable

if __package__:
    from . import shim_process
else:   # loaded by file path (deploy/gpu_check.py): shim_process.py sits beside it
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import shim_process


OnCheckpoint = Callable[[str, float], Awaitable[None]]
EXIT_TERMINATED = 128 + int(signal.SIGTERM)
EXIT_KILLED = 128 + int(signal.SIGKILL)
EXIT_NOT_STARTED = 127   # a workload that never started (exec's 127; the shim's EXIT_NOT_STARTED)
STATUS_FILE = "shim.json"


@dataclass(frozen=True)
class WorkerExit:
    """How a worker ended. ``exit_code`` is 128 + ``signal`` when a signal ended it."""
    exit_code: int
    signal: int = 0
    fenced: bool = False
    reason: str = ""


def killed_unasked(end: WorkerExit) -> bool:
    """SIGKILLed by nothing the shim or the agent did (no stop, kill deadline or fence):
    the shim's plain "killed by signal 9". With the kernel's OOM count risen meanwhile,
    the out-of-memory killer's work."""
    return end.signal == signal.SIGKILL and not end.fenced and end.reason == f"killed by signal {int(signal.SIGKILL)}"


OUTPUT_FILE = "output.log"
OUTPUT_TAIL = 64 * 1024   # what is read of a failed worker's output for its cause
# What frameworks print when a GPU allocation fails: PyTorch (CUDA and ROCm), the CUDA
# runtime and cuBLAS, JAX/XLA and TensorFlow.
_DEVICE_OOM = re.compile(rb"CUDA out of memory|HIP out of memory|CUDA error: out of memory|cudaErrorMemoryAllocation"
                         rb"|CUBLAS_STATUS_ALLOC_FAILED|RESOURCE_EXHAUSTED: Out of memory"
                         rb"|ResourceExhaustedError: OOM when allocating")


def device_out_of_memory(output: Path) -> str:
    """What the end of a worker's output says of a GPU memory allocation that failed
    (the matching words), or "" when it says none or cannot be read."""
    try:
        with open(output, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - OUTPUT_TAIL))
            tail = f.read()
    except OSError:
        return ""
    found = None
    for found in _DEVICE_OOM.finditer(tail):
        pass
    return found.group().decode() if found is not None else ""


def read_status(path: Path) -> dict | None:
    """A shim's status file, or None when it is missing or unreadable."""
    try:
        status = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return status if isinstance(status, dict) else None


def check_seconds(field: str, value: float, positive: bool = False) -> None:
    """Refuse a duration that is not one, naming the field."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (positive and value == 0):
        raise ValueError(f"{field} must be a finite number of seconds {'> 0' if positive else '>= 0'}, got {value!r}")


def exit_from_status(status: dict) -> WorkerExit:
    """The end a shim recorded (its status has ``ended_at``)."""
    sig = int(status.get("signal") or 0)
    code = status.get("exit_code")
    return WorkerExit(exit_code=128 + sig if code is None else int(code), signal=sig,
                      fenced=bool(status.get("fenced")), reason=str(status.get("reason", "")))


class SimulatedRun:
    """Simulated training: ``duration`` seconds of work in all, of which ``resume_from``
    are already done; checkpoints every ``interval`` and once more when stopped."""

    under_lease = False   # nothing of it runs under the node's lease

    def __init__(self, duration: float, resume_from: float = 0.0, interval: float = 0.0,
                 on_checkpoint: OnCheckpoint | None = None, location: str = "sim://") -> None:
        self.duration = duration
        self.done = min(resume_from, duration)
        self.interval = interval
        self.on_checkpoint = on_checkpoint
        self.location = location
        self._stopped = asyncio.Event()

    async def start(self) -> None:
        return None

    async def wait(self) -> WorkerExit:
        loop = asyncio.get_running_loop()
        started, base = loop.time(), self.done
        while True:
            progress = base + loop.time() - started
            left = self.duration - progress
            if left <= 0:
                return WorkerExit(0, reason="exited with code 0")
            step = min(left, self.interval) if self.interval > 0 else left
            try:
                await asyncio.wait_for(self._stopped.wait(), step)
            except asyncio.TimeoutError:
                progress = min(self.duration, base + loop.time() - started)
                if progress < self.duration:
                    await self._checkpoint(progress)
                continue
            await self._checkpoint(base + loop.time() - started)   # graceful stop: save first
            return WorkerExit(EXIT_TERMINATED, int(signal.SIGTERM), reason="stopped on request")

    async def _checkpoint(self, progress: float) -> None:
        if self.on_checkpoint is not None:
            await self.on_checkpoint(f"{self.location}@{progress:.3f}", progress)

    async def stop(self, grace: float) -> None:
        self._stopped.set()



class ProcessRun:
    """A real workload, run under its worker shim (``shim.c``, spawned by the agent:
    ``shim_process``) in a session of its own.

    The workload's stdout and stderr go to ``<workdir>/output.log`` (``OUTPUT_FILE``,
    appended to by each start). The shim starts the workload, forwards a stop (SIGTERM, then SIGKILL after
    ``kill_wait``), fences it when the lease at ``lease_path`` runs out (no lease: never
    fenced) and records its end in ``<workdir>/shim.json``, which outlives the agent.
    The workload learns where to resume from ``GPUSCHED_RESUME_FROM`` and reports a
    checkpoint by writing "<location> <progress_s>" to ``GPUSCHED_CHECKPOINT_FILE``. On
    simulated GPUs it may state its own GPU load by writing a percentage to
    ``GPUSCHED_USAGE_FILE`` (the usage sampler reads it; NVML nodes measure instead).
    ``devices`` (``acquire() -> env``, ``release()``) gives it its GPUs
    (``CUDA_VISIBLE_DEVICES``, MIG instances, MPS limits): acquired before the shim
    starts (an OSError there means it cannot start), released once the workload is gone,
    before ``wait`` returns."""

    POLL_S = 0.5            # checkpoint file
    START_TIMEOUT_S = 30.0  # for the shim's word that it started the workload (or could not)
    STOP_MARGIN_S = 3.0     # past the shim's own kill deadline before the agent steps in
    GONE_TIMEOUT_S = 10.0

    def __init__(self, command: tuple[str, ...], env: dict[str, str], workdir: Path,
                 on_checkpoint: OnCheckpoint | None = None, *, devices=None,
                 lease_path: Path | None = None, kill_wait: float = 10.0, poll: float = 0.1) -> None:
        if not command:
            raise ValueError("command: nothing to run")
        check_seconds("kill_wait", kill_wait)
        check_seconds("poll", poll, positive=True)
        workdir = Path(workdir).absolute()    # the shim runs in it: relative paths would shift
        self.command = command
        self.checkpoint_file = workdir / "checkpoint"
        self.status_file = workdir / STATUS_FILE
        self.output_file = workdir / OUTPUT_FILE
        self.usage_file = workdir / "usage"
        self.env = {**os.environ, **env, "GPUSCHED_CHECKPOINT_FILE": str(self.checkpoint_file),
                    "GPUSCHED_USAGE_FILE": str(self.usage_file)}
        self.devices = devices
        self.workdir = workdir
        self.on_checkpoint = on_checkpoint
        self.lease_path = lease_path
        self.kill_wait = kill_wait
        self.poll = poll
        self.pid: int | None = None             # the workload's (its group's id too)
        self._proc: shim_process.ShimProcess | None = None   # the shim
        self._seen = ""
        self._backstop = ""                     # why the agent had to kill, if it did
        self._stop_asked = False

    @property
    def under_lease(self) -> bool:
        """Its shim runs (started here or adopted): its workload may be running under the
        node's lease."""
        return self._proc is not None and not self._proc.ended

    def shim_args(self) -> list[str]:
        """The shim's arguments (``gpusched-shim ARGS``; checked in ``__init__``)."""
        lease = ["--lease", str(Path(self.lease_path).absolute())] if self.lease_path is not None else []
        return [*lease, "--kill-wait", repr(float(self.kill_wait)), "--poll", repr(float(self.poll)),
                "--status", str(self.status_file), "--output", str(self.output_file), "--", *self.command]

    async def start(self) -> None:
        """Start the shim and return once it started the workload; OSError when it could not.
        The shim makes the worker's folder (and removes an earlier status file)."""
        if self.devices is not None:
            self.env.update(self.devices.acquire())
        try:
            await self._start_shim()
        except BaseException:
            self._release()
            raise

    def adopt(self, status: dict) -> bool:
        """Take over this worker's shim from an earlier life of the agent, as its status
        (``shim.json``, no end recorded) names it: ``wait`` and ``stop`` then work as for
        a shim this run started, the devices having been acquired by that earlier life.
        False when the shim is gone (or its pid is another process's now)."""
        pid, shim_pid, shim_start = status.get("pid"), status.get("shim_pid"), status.get("shim_start")
        if not all(isinstance(v, int) and not isinstance(v, bool) and v > 1 for v in (pid, shim_pid)) \
                or not isinstance(shim_start, int):
            return False
        proc = shim_process.adopt(shim_pid, shim_start)
        if proc is None:
            return False
        self._proc, self.pid = proc, pid
        return True

    async def _start_shim(self) -> None:
        self._proc = await shim_process.spawn(self.shim_args(), self.env, str(self.workdir))
        status = await self._started_status()
        if status is None:   # the shim ended, or is ending, without a status file
            try:
                code = await asyncio.wait_for(asyncio.shield(self._proc.wait()), self.GONE_TIMEOUT_S)
            except asyncio.TimeoutError:
                self._proc.kill()
                code = await self._proc.wait()
            raise OSError(f"the worker shim ended with code {code} before starting {self.command[0]}")
        pid = status.get("pid")
        if not isinstance(pid, int) or pid <= 1:
            await self._proc.wait()
            reason = status.get("reason", "the worker shim did not start the workload")
            raise (LeaseExpired if reason.startswith(LEASE_EXPIRED) else OSError)(reason)
        self.pid = pid
        if self._stop_asked:   # stop() came while the shim was starting: pass it on now
            self._proc.send_signal(signal.SIGTERM)

    async def _started_status(self) -> dict | None:
        """The workload's pid as the shim wrote it on its pipe; else (nothing started) the
        status file, or None when the shim ended without writing one."""
        try:
            word = await asyncio.wait_for(asyncio.shield(self._proc.written), self.START_TIMEOUT_S)
        except asyncio.TimeoutError:
            self._proc.kill()
            raise OSError(f"the worker shim did not start {self.command[0]} within {self.START_TIMEOUT_S:g}s") \
                from None
        return word if isinstance(word, dict) else read_status(self.status_file)

    async def wait(self) -> WorkerExit:
        while True:
            try:
                code = await asyncio.wait_for(asyncio.shield(self._proc.wait()), self.POLL_S)
                await self._poll_checkpoint()
                end = await self._end(code)
                self._release()   # only once the workload is gone
                return end
            except asyncio.TimeoutError:
                await self._poll_checkpoint()

    def _release(self) -> None:
        if self.devices is not None:
            self.devices.release()

    async def _end(self, shim_code: int | None) -> WorkerExit:
        status = read_status(self.status_file)
        if status is not None and "ended_at" in status:
            return exit_from_status(status)
        # The shim died without recording the end (killed): the workload has lost its
        # fence, so it is killed here and reported only once it is really gone.
        if shim_code is None:
            shim = "ended (exit code unknown)"
        else:
            shim = f"killed by signal {-shim_code}" if shim_code < 0 else f"exited with code {shim_code}"
        if self.pid is not None:
            _signal_group(self.pid, signal.SIGKILL)
            await wait_group_gone(self.pid, self.GONE_TIMEOUT_S)
        why = self._backstop or f"worker shim {shim} without recording the end"
        return WorkerExit(EXIT_KILLED, int(signal.SIGKILL), reason=f"{why}; the agent SIGKILLed the workload")

    async def _poll_checkpoint(self) -> None:
        try:
            text = self.checkpoint_file.read_text().strip()
        except OSError:
            return
        if not text or text == self._seen or self.on_checkpoint is None:
            return
        self._seen = text
        location, _, progress = text.rpartition(" ")
        try:
            done = float(progress)
        except ValueError:
            location, done = text, 0.0
        await self.on_checkpoint(location or text, done)

    async def stop(self, grace: float) -> None:
        """SIGTERM to the shim, which forwards it and SIGKILLs the workload after its
        kill-wait; the agent kills both itself only if the shim overstays that."""
        self._stop_asked = True
        proc = self._proc
        if proc is None or proc.ended or self.pid is None:   # still starting: the start passes it on
            return
        try:
            proc.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            return
        limit = max(grace, self.kill_wait) + self.STOP_MARGIN_S
        try:
            await asyncio.wait_for(asyncio.shield(proc.wait()), limit)
        except asyncio.TimeoutError:
            self._backstop = f"worker shim still there {limit:g}s after SIGTERM"
            if self.pid is not None:
                _signal_group(self.pid, signal.SIGKILL)
            _signal_group(proc.pid, signal.SIGKILL)


class LeaseExpired(OSError):
    """The shim did not start the workload: the node's lease had run out (no fault of the
    job's: it is placed again, uncharged)."""


LEASE_EXPIRED = "not started: lease expired"   # how the shim says it (shim.c, start)


class NothingToRun(Exception):
    """A job without a command on a node that runs real processes."""


class NotStarted:
    """The run of a worker whose run could not even be made: its start raises why."""

    def __init__(self, why: Exception) -> None:
        self.why = why

    async def start(self) -> None:
        raise self.why

    async def stop(self, grace: float) -> None:
        return None


def why_not_started(exc: Exception) -> str:
    """A start's failure as its reason: an OSError says it itself (a missing program, a
    device that cannot be set up), and so does ``NothingToRun``; anything else is named by
    its type too (``ValueError: embedded null byte``)."""
    return str(exc) if isinstance(exc, (OSError, NothingToRun)) else f"{type(exc).__name__}: {exc}"


async def wait_group_gone(pgid: int, timeout: float, poll: float = 0.02) -> bool:
    """True once no process of group ``pgid`` is left (not our children: polled)."""
    deadline = time.monotonic() + timeout
    while group_alive(pgid):
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(poll)   # another process's state: nothing to await but a poll
    return True


def group_alive(pgid: int) -> bool:
    """Some process of group ``pgid`` is still running (zombies do not count)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return _live_member(pgid)


def _live_member(pgid: int) -> bool:
    """killpg also finds zombies: ended members nobody reaped yet, which where no init
    reaps orphans (some containers) stay forever. /proc tells them apart (Linux)."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return True
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                text = f.read()
            state, _ppid, group = text[text.rindex(")") + 2:].split()[:3]
        except (OSError, ValueError):
            continue
        if int(group) == pgid and state not in "ZX":
            return True
    return False


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass
