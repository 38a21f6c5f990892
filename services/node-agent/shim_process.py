"""The worker shim as the agent runs it: the compiled program ``gpusched-shim`` (built
from ``shim.c`` beside this file: by the package build, or by deploy/setup.sh in a
checkout) spawned by the agent itself with ``posix_spawn``, one per worker.

The shim is this agent's child: its end comes through a pidfd on the event loop (no
thread, no SIGCHLD handler), and its pid cannot be reused before it is reaped here, so
signals to it never reach a stranger. A restarted agent ``adopt``s the shims an earlier
life of it spawned: those are not its children, so it signals them through their pidfd
(which never reaches a later process with the same pid) and learns their end from the
status file alone. It writes its workload's pid on a pipe once its
first status is written, so the agent reads no file for a start. ``missing()`` says
why the shim cannot run here (the binary is not built, or the kernel has no pidfd);
the node-agent checks it at start-up and refuses to run real workloads without it.
"""
from __future__ import annotations

import asyncio
import functools
import os
import signal
from pathlib import Path

if __package__:
    from .proc_info import proc_stat
else:   # loaded by file path (deploy/gpu_check.py): proc_info.py sits beside it
    from proc_info import proc_stat

BINARY = Path(__file__).resolve().with_name("gpusched-shim")
WRITTEN_FD = 3   # the shim's end of its "status written" pipe
# The agent is a Python process: it ignores these, and an ignored signal stays ignored
# across exec. The shim gives its workload every default anyway; this is for itself.
_PYTHON_IGNORES = tuple(getattr(signal, name) for name in ("SIGPIPE", "SIGXFSZ") if hasattr(signal, name))
HOW_TO_BUILD = ("install a C compiler and reinstall the package (pip install --force-reinstall --no-binary gpusched "
                "'gpusched[agent]'), or run deploy/setup.sh in a checkout")


def missing() -> str | None:
    """Why no worker shim can run here, in one line that says what to do; None when it can."""
    if not os.access(BINARY, os.X_OK):
        return f"the worker shim {BINARY} is not built: {HOW_TO_BUILD}"
    if not _has_pidfd():
        return "the worker shim needs Linux 5.3 or later (pidfd_open): run real workloads on a newer kernel"
    return None


@functools.cache
def _has_pidfd() -> bool:
    try:
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError):
        return False
    return True


class ShimProcess:
    """A shim this agent spawned, until it is reaped."""

    def __init__(self, pid: int, loop: asyncio.AbstractEventLoop, written_r: int | None,
                 pidfd: int | None = None) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self.ended = False
        # Done once the shim wrote its first status: {"pid": its workload's}; True when it
        # wrote no pid (nothing started, or it ended first): the status file says why.
        self.written: asyncio.Future = loop.create_future()
        self._exited: asyncio.Future = loop.create_future()
        self._loop = loop
        self.adopted = pidfd is not None         # not our child: no exit code to reap
        self._pidfd = os.pidfd_open(pid) if pidfd is None else pidfd
        self._written_r = written_r
        if written_r is None:
            self.written.set_result(True)
        else:
            loop.add_reader(written_r, self._on_written)
        loop.add_reader(self._pidfd, self._on_exit)

    def _on_written(self) -> None:
        try:
            word = os.read(self._written_r, 32)   # written at once (under PIPE_BUF), then closed
        except OSError:
            word = b""
        self._loop.remove_reader(self._written_r)
        os.close(self._written_r)
        if not self.written.done():
            self.written.set_result({"pid": int(word)} if word.isdigit() else True)

    def _on_exit(self) -> None:
        if self.adopted:   # another process reaps it (init, or a subreaper): its code is lost
            pid, status = self.pid, None
        else:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:   # reaped elsewhere: its code is lost
                pid, status = self.pid, None
        if pid == 0:
            return
        self._loop.remove_reader(self._pidfd)
        os.close(self._pidfd)
        self.returncode = None if status is None else os.waitstatus_to_exitcode(status)
        self.ended = True
        self._exited.set_result(self.returncode)

    def wait(self) -> asyncio.Future:
        """The shim's exit code (negative: the signal that ended it; None: unknown)."""
        return self._exited

    def send_signal(self, sig: int) -> None:
        if self.ended:
            return
        if self.adopted:   # the pidfd names this very process, whoever reaps it
            signal.pidfd_send_signal(self._pidfd, sig)
        else:              # not reaped yet: the pid is still this shim's
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


async def spawn(args: list[str], env: dict[str, str], cwd: str) -> ShimProcess:
    """Start the shim with ``args`` (``ProcessRun.shim_args``) in a session of its own;
    OSError when it cannot be started (``missing()`` says why, where it can). The shim
    makes ``cwd`` and removes an earlier status file there."""
    if (why := missing()) is not None:
        raise OSError(why)
    loop = asyncio.get_running_loop()
    written_r, written_w = os.pipe()
    if written_w == WRITTEN_FD:   # dup2 onto itself would keep close-on-exec
        written_w, old = os.dup(written_w), written_w
        os.close(old)
    try:
        argv = [str(BINARY), "--cwd", cwd, "--written-fd", str(WRITTEN_FD), *args]
        pid = os.posix_spawn(str(BINARY), argv, env, setsid=True, setsigdef=_PYTHON_IGNORES,
                             file_actions=[(os.POSIX_SPAWN_DUP2, written_w, WRITTEN_FD)])
    except BaseException:
        os.close(written_r)
        raise
    finally:
        os.close(written_w)
    return ShimProcess(pid, loop, written_r)


def adopt(pid: int, started: int) -> ShimProcess | None:
    """A shim an earlier life of this agent spawned, found by its pid and its start
    (``proc_info.proc_stat``, as the shim recorded it in its status); None when that
    process is gone (or is another one now)."""
    try:
        pidfd = os.pidfd_open(pid)
    except (OSError, ValueError):
        return None
    stat = proc_stat(pid)   # read after the pidfd is open: a match means the pidfd is that shim
    if stat is None or stat[0] in "ZX" or stat[1] != started:
        os.close(pidfd)
        return None
    return ShimProcess(pid, asyncio.get_running_loop(), None, pidfd=pidfd)
