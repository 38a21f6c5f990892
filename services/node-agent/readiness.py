"""A service replica's readiness, checked by the agent that runs its worker 0
(``Readiness`` in gpusched/core/model.py; docs/guide/workloads.md, "Services").

After ``initial_delay_s``, every ``every_s``: an HTTP GET of ``http://127.0.0.1:PORT<http_path>``
answering 2xx or 3xx within ``within_s``, or ``command`` exiting 0 within it, is a pass;
anything else (another status, a refused connection, a timeout, another exit code) is a
failure. ``passes`` passes in a row make the replica ready, ``failures`` failures in a
row not ready; each change is handed to ``on_change(ready, reason)`` once. A replica
without a check is ready once its worker started. Everything here is asyncio: a check
never blocks the agent's loop.

The port a worker serves on (``PORT``) is kept in its folder (``PORT_FILE``), so an agent
that restarts and adopts the running worker checks the same port.
"""
from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import Awaitable, Callable

from gpusched.core.model import Readiness

log = logging.getLogger("gpusched.node_agent")
PORT_FILE = "port"
Probe = Callable[[], Awaitable[tuple[bool, str]]]
OnChange = Callable[[bool, str], Awaitable[None]]


def keep_port(workdir: Path, port: int) -> None:
    """Write the worker's serving port into its folder (made here; the shim makes it too)."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / PORT_FILE).write_text(f"{port}\n")


def kept_port(workdir: Path) -> int:
    """The port ``keep_port`` kept for the worker; 0 when none was."""
    try:
        return int((workdir / PORT_FILE).read_text().strip())
    except (OSError, ValueError):
        return 0


async def http_check(port: int, path: str, timeout: float) -> tuple[bool, str]:
    """One GET of ``path`` on 127.0.0.1:``port``: passed (2xx or 3xx) and why."""
    async def get() -> tuple[bool, str]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            target = path if path.startswith("/") else "/" + path
            writer.write(f"GET {target} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n".encode())
            await writer.drain()
            line = (await reader.readline()).decode("latin-1").split()
        finally:
            writer.close()
        if len(line) < 2 or not line[0].startswith("HTTP/") or not line[1].isdigit():
            return False, "not an HTTP answer"
        code = int(line[1])
        return 200 <= code < 400, f"http {code}"
    try:
        return await asyncio.wait_for(get(), timeout)
    except asyncio.TimeoutError:
        return False, f"no answer within {timeout:g}s"
    except ConnectionRefusedError:
        return False, "connection refused"
    except OSError as exc:
        return False, exc.strerror or type(exc).__name__


async def command_check(command: tuple[str, ...], env: dict[str, str], timeout: float) -> tuple[bool, str]:
    """Run ``command`` (with ``env`` over the agent's environment): passed (exit 0) and why."""
    try:
        proc = await asyncio.create_subprocess_exec(*command, env={**os.environ, **env},
                                                    stdin=asyncio.subprocess.DEVNULL,
                                                    stdout=asyncio.subprocess.DEVNULL,
                                                    stderr=asyncio.subprocess.DEVNULL)
    except OSError as exc:
        return False, f"cannot run {command[0]}: {exc.strerror or exc}"
    try:
        code = await asyncio.wait_for(proc.wait(), timeout)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        return False, f"no exit within {timeout:g}s"
    except asyncio.CancelledError:
        proc.kill()
        await asyncio.shield(proc.wait())
        raise
    return code == 0, f"exit {code}" if code >= 0 else f"killed by signal {-code}"


def probe_for(readiness: Readiness, port: int, env: dict[str, str]) -> Probe | None:
    """The replica's check as a probe; None when it has none."""
    if readiness.http_path:
        return lambda: http_check(port, readiness.http_path, readiness.within_s)
    if readiness.command:
        return lambda: command_check(readiness.command, env, readiness.within_s)
    return None


class ReadinessWatch:
    """Counts a replica's check results and hands each change of its readiness on.
    ``ready``: what the log is known to say at the start (False for a worker just
    started; None, unknown, for one adopted after a restart: its first verdict is handed
    on whichever it is)."""

    def __init__(self, readiness: Readiness, probe: Probe | None, on_change: OnChange,
                 ready: bool | None = False) -> None:
        self.readiness = readiness
        self.probe = probe
        self.on_change = on_change
        self.ready = ready
        self.passed = 0      # passes in a row
        self.failed = 0      # failures in a row

    def count(self, passed: bool) -> bool | None:
        """Count one result: the new readiness when it changes, else None. Pure."""
        if passed:
            self.passed, self.failed = self.passed + 1, 0
            verdict = True if self.passed >= self.readiness.passes else None
        else:
            self.passed, self.failed = 0, self.failed + 1
            verdict = False if self.failed >= self.readiness.failures else None
        if verdict is None or verdict == self.ready:
            return None
        self.ready = verdict
        return verdict

    async def run(self) -> None:
        """Check until cancelled (the worker ended or is being stopped)."""
        if self.probe is None:
            if self.ready is not True:
                self.ready = True
                await self.on_change(True, "started (no readiness check)")
            return
        loop = asyncio.get_running_loop()
        await asyncio.sleep(self.readiness.initial_delay_s)
        while True:
            began = loop.time()
            try:
                passed, reason = await self.probe()
            except asyncio.CancelledError:
                raise
            except Exception as exc:   # a check that cannot even be made fails
                passed, reason = False, f"check failed: {exc!r}"
            changed = self.count(passed)
            if changed is not None:
                await self.on_change(changed, reason)
            await asyncio.sleep(max(0.0, began + self.readiness.every_s - loop.time()))
