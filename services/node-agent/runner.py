"""Running one worker: a real process with CUDA_VISIBLE_DEVICES, or a simulated run."""
from __future__ import annotations

import asyncio
import os
import signal

from gpusched.core.model import GpuSlot


class SimulatedRun:
    """Holds its GPUs for ``duration`` seconds, then exits 0; a stop ends it early."""

    def __init__(self, duration: float) -> None:
        self.duration = duration
        self._stopped = asyncio.Event()

    async def start(self) -> None:
        return None

    async def wait(self) -> int:
        try:
            await asyncio.wait_for(self._stopped.wait(), self.duration)
            return -int(signal.SIGTERM)
        except asyncio.TimeoutError:
            return 0

    async def stop(self, grace: float) -> None:
        self._stopped.set()


class ProcessRun:
    """A real workload process. Stop = SIGTERM, then SIGKILL after ``grace`` seconds."""

    def __init__(self, command: tuple[str, ...], gpus: tuple[GpuSlot, ...], uuids: list[str], env: dict[str, str]) -> None:
        self.command = command
        self.env = {**os.environ, **env,
                    "CUDA_VISIBLE_DEVICES": ",".join(uuids[s.index] for s in gpus)}
        self._proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        self._proc = await asyncio.create_subprocess_exec(*self.command, env=self.env, start_new_session=True)

    async def wait(self) -> int:
        return await self._proc.wait()

    async def stop(self, grace: float) -> None:
        proc = self._proc
        if proc is None or proc.returncode is not None:
            return
        _signal_group(proc.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), grace)
        except asyncio.TimeoutError:
            _signal_group(proc.pid, signal.SIGKILL)
            await proc.wait()


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass
