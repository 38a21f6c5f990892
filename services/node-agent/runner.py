"""Running one worker: a real process with its devices (``devices.WorkerDevices``), or a
simulated run.

Both report checkpoints through ``on_checkpoint(location, progress_s)``, where
``progress_s`` is the job's total work done so far (seconds), so a resumed attempt
starts where the checkpoint left off and the log shows how much work a stop lost.
"""
from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Awaitable, Callable

OnCheckpoint = Callable[[str, float], Awaitable[None]]
EXIT_TERMINATED = 128 + int(signal.SIGTERM)


class SimulatedRun:
    """Simulated training: ``duration`` seconds of work in all, of which ``resume_from``
    are already done; checkpoints every ``interval`` and once more when stopped."""

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

    async def wait(self) -> int:
        loop = asyncio.get_running_loop()
        started, base = loop.time(), self.done
        while True:
            progress = base + loop.time() - started
            left = self.duration - progress
            if left <= 0:
                return 0
            step = min(left, self.interval) if self.interval > 0 else left
            try:
                await asyncio.wait_for(self._stopped.wait(), step)
            except asyncio.TimeoutError:
                progress = min(self.duration, base + loop.time() - started)
                if progress < self.duration:
                    await self._checkpoint(progress)
                continue
            await self._checkpoint(base + loop.time() - started)   # graceful stop: save first
            return EXIT_TERMINATED

    async def _checkpoint(self, progress: float) -> None:
        if self.on_checkpoint is not None:
            await self.on_checkpoint(f"{self.location}@{progress:.3f}", progress)

    async def stop(self, grace: float) -> None:
        self._stopped.set()


class ProcessRun:
    """A real workload process. Stop = SIGTERM, then SIGKILL after ``grace`` seconds.

    The workload learns where to resume from ``GPUSCHED_RESUME_FROM`` and reports a
    checkpoint by writing "<location> <progress_s>" to ``GPUSCHED_CHECKPOINT_FILE``.
    ``devices`` (``acquire() -> env``, ``release()``) gives it its GPUs: acquired before
    the process starts (an OSError there means it cannot start), released once it ended,
    before ``wait`` returns."""

    POLL_S = 0.5

    def __init__(self, command: tuple[str, ...], env: dict[str, str], workdir: Path,
                 on_checkpoint: OnCheckpoint | None = None, devices=None) -> None:
        self.command = command
        self.checkpoint_file = workdir / "checkpoint"
        self.env = {**os.environ, **env, "GPUSCHED_CHECKPOINT_FILE": str(self.checkpoint_file)}
        self.workdir = workdir
        self.on_checkpoint = on_checkpoint
        self.devices = devices
        self._proc: asyncio.subprocess.Process | None = None
        self._seen = ""

    async def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.devices is not None:
            self.env.update(self.devices.acquire())
        try:
            self._proc = await asyncio.create_subprocess_exec(
                *self.command, env=self.env, cwd=self.workdir, start_new_session=True)
        except OSError:
            self._release()
            raise

    async def wait(self) -> int:
        while True:
            try:
                code = await asyncio.wait_for(asyncio.shield(self._proc.wait()), self.POLL_S)
                await self._poll_checkpoint()
                self._release()
                return code
            except asyncio.TimeoutError:
                await self._poll_checkpoint()

    def _release(self) -> None:
        if self.devices is not None:
            self.devices.release()

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
        proc = self._proc
        if proc is None or proc.returncode is not None:
            return
        _signal_group(proc.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.shield(proc.wait()), grace)
        except asyncio.TimeoutError:
            _signal_group(proc.pid, signal.SIGKILL)


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass
