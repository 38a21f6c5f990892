"""The shim launcher: one long-lived small process per agent that forks the worker shims,
so a launch costs a fork instead of a new Python interpreter (as multiprocessing's
forkserver).

    python -S .../launcher.py --fd N

The agent starts it (``Launcher``) with one end of a socket pair as fd N, and sends it
one JSON line per launch: ``{"id", "shim", "env", "unset", "cwd"}`` (``shim``: the
shim's settings, ``shim.run``'s arguments, which the agent has checked; ``env`` and
``unset``: how the workload's environment differs from the launcher's). The launcher
removes an earlier run's status file and forks; the child does what ``python -S shim.py
ARGS`` would in a process of its own: a new session, ``cwd`` (made here: a busy journal
can block a mkdir for milliseconds), ``shim.run(**shim)`` with exactly the environment
asked for, and exits with its code.
The launcher answers ``{"id", "pid", "start"}`` (the shim's pid and its start in clock
ticks, which tells it from a later process with the same pid), or ``{"id", "error"}``;
``{"id", "written", "pid"}`` once the shim wrote its first status file, with the workload's
pid (null when not started or the shim ended first: the agent reads the file then), and
``{"id", "code"}`` once it reaped that shim (``code``: negative for a signal).

Nothing depends on the launcher staying alive: each shim is in a session of its own and
fences its workload by the lease alone. When the agent goes (end of file on the socket;
a clean stop also reaps it, ``shutdown``) the launcher exits and leaves its shims running;
when the launcher goes, the agent judges its shims by their status files and starts a new
launcher for the next launch. A forked shim waits for the launcher's go, sent once the
agent has its pid: a launcher that dies between the fork and that message leaves no shim
that starts a workload the agent never heard of (the shim exits, code 126). Standard
library only, and only what a shim needs (imported once, here): each fork copies the
launcher's page tables, and each page either side writes afterwards (asyncio alone
would double both).
"""
from __future__ import annotations

import itertools
import json
import os
import select
import signal
import socket
import sys

if __package__:
    from . import shim
else:   # run as a file (the package need not be installed): shim.py sits beside it
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import shim

if __name__ == "__main__":
    # Once here, inherited by each forked shim: libc's prctl, the boot id, the base environment.
    shim.prctl()
    shim.boot_id()
    BASE_ENV = dict(os.environ)
    import gc
    gc.freeze()   # what is here stays: no collection scans it, nor writes to its pages in a fork
else:   # the agent's side (``Launcher``)
    import asyncio

LAUNCHER = os.path.abspath(__file__)
LOST = object()   # a shim's end that no launcher can report any more
EXIT_NO_GO = 126  # a shim whose launcher died before the agent learnt of it: nothing started
GONE_POLL_S = 0.05


# --- the launcher process -----------------------------------------------------------------
def serve(conn: socket.socket) -> None:
    """Launch and reap shims until the agent closes its end."""
    wake_r, wake_w = os.pipe()            # SIGCHLD wakes the select() below
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    children: dict[int, int] = {}         # shim pid -> launch id
    starting: dict[int, int] = {}         # read end of a shim's "status written" pipe -> launch id
    pending = b""
    try:
        while True:
            ready = select.select([conn, wake_r, *starting], [], [])[0]
            if wake_r in ready:
                os.read(wake_r, 512)
            _tell_written(conn, starting, ready)
            _reap(conn, children)
            if conn in ready:
                data = conn.recv(1 << 16)
                if not data:
                    return                # the agent is gone: its shims run on without us
                pending += data
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    _launch(conn, json.loads(line), children, starting, (wake_r, wake_w))
    except BrokenPipeError:
        return


def _tell_written(conn: socket.socket, starting: dict[int, int], ready: list) -> None:
    """A shim wrote its first status and its workload's pid (or ended first): tell the agent."""
    for fd in [fd for fd in starting if fd in ready]:
        pid = os.read(fd, 32)             # written at once (under PIPE_BUF): all of it or nothing
        os.close(fd)
        _send(conn, {"id": starting.pop(fd), "written": True, "pid": int(pid) if pid.isdigit() else None})


def _launch(conn: socket.socket, request: dict, children: dict[int, int], starting: dict[int, int],
            fds: tuple[int, int]) -> None:
    # The shim starts its workload only once the agent was told its pid ("go" below): a
    # launcher that dies in between closes the pipe, and the shim exits without starting
    # anything, so no workload runs that the agent has not heard of.
    try:   # gone before the agent hears of the shim: it must not read an earlier run's
        if os.path.lexists(status := request["shim"]["status"]):
            os.unlink(status)
    except OSError as exc:
        _send(conn, {"id": request["id"], "error": f"cannot remove an earlier status file: {exc}"})
        return
    go_r, go_w = os.pipe()
    written_r, written_w = os.pipe()      # the shim's word (its workload's pid) once its status is written
    try:
        pid = os.fork()
    except OSError as exc:
        for fd in (go_r, go_w, written_r, written_w):
            os.close(fd)
        _send(conn, {"id": request["id"], "error": f"cannot fork the worker shim: {exc}"})
        return
    if pid == 0:
        conn.close()
        for fd in (go_w, written_r, *starting):
            os.close(fd)
        _run_shim(request, (*fds, go_r), written_w)
    os.close(go_r)
    os.close(written_w)
    starting[written_r] = request["id"]
    children[pid] = request["id"]
    try:
        _send(conn, {"id": request["id"], "pid": pid, "start": (start := shim.proc_start(pid))})
        os.write(go_w, b"g" if start is None else str(start).encode())   # the shim's: no second read
    finally:
        os.close(go_w)


def _run_shim(request: dict, fds: tuple[int, int, int], written: int) -> None:
    """In the forked child: become what ``python -S shim.py ARGV`` was, once the launcher
    says go; never returns. ``written``: the pipe that tells the launcher the shim wrote
    its first status."""
    code = EXIT_NO_GO
    try:
        *inherited, go = fds
        for fd in inherited:
            os.close(fd)
        go_word = os.read(go, 32)         # "g", or the shim's start (clock ticks)
        if not go_word:                   # the launcher died before the agent had our pid
            os._exit(EXIT_NO_GO)
        os.close(go)
        code = 1
        signal.set_wakeup_fd(-1)
        shim.set_handler(signal.SIGCHLD, shim.SIG_DFL)
        os.setsid()                       # its own session: signals to the agent's group miss it
        os.makedirs(request["cwd"], exist_ok=True)
        os.chdir(request["cwd"])
        code = shim.run(**request["shim"], written=_telling(written), env=shim.environment(
            BASE_ENV, request["env"], request["unset"]), shim_start=int(go_word) if go_word.isdigit() else None)
    except BaseException:
        import traceback                  # the error path's alone: a smaller launcher forks faster
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)


def _telling(fd: int):
    """What a forked shim calls once its first status is written: its workload's pid, if any."""
    def tell(pid: int | None) -> None:
        try:
            os.write(fd, b"" if pid is None else str(pid).encode())
        except OSError:
            pass   # the launcher is gone: the agent reads the status file on its own
        finally:
            os.close(fd)
    return tell


def _reap(conn: socket.socket, children: dict[int, int]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        launch = children.pop(pid, None)
        if launch is not None:
            _send(conn, {"id": launch, "code": os.waitstatus_to_exitcode(status)})


def _send(conn: socket.socket, message: dict) -> None:
    conn.sendall(json.dumps(message).encode() + b"\n")


# --- the agent's side ---------------------------------------------------------------------
class ShimProcess:
    """A shim the launcher forked: its pid, and its end as the launcher reports it."""

    def __init__(self, pid: int, start: int | None, ended: asyncio.Future, written: asyncio.Future | None = None) -> None:
        self.pid, self.start = pid, start
        # Done once the shim wrote its first status: {"pid": its workload's} when the launcher
        # passed one on, else True (False: the launcher went, nothing more will tell).
        self.written = written if written is not None else ended
        self.returncode: int | None = None    # once reaped; None too when only its absence is known
        self.ended = False
        self._reported = ended
        self._waiter: asyncio.Future | None = None

    def wait(self) -> asyncio.Future:
        """The shim's exit code (negative: the signal that ended it), or None when its
        launcher went first and it could only be seen gone."""
        if self._waiter is None:
            self._waiter = asyncio.ensure_future(self._wait())
        return self._waiter

    async def _wait(self) -> int | None:
        code = await self._reported
        if code is LOST:
            while self.alive():
                await asyncio.sleep(GONE_POLL_S)   # not our child any more: nothing to await
            code = None
        self.returncode, self.ended = code, True
        return code

    def alive(self) -> bool:
        """Still running (not a zombie, not a later process that reuses its pid)."""
        stat = shim.proc_stat(self.pid)
        return stat is not None and stat[0] not in "ZX" and (self.start is None or stat[1] == self.start)

    def send_signal(self, sig: int) -> None:
        if self.ended or (self._reported.done() and not self.alive()):
            return
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Launcher:
    """The agent's end of one launcher process (see the module's doc)."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.process: asyncio.subprocess.Process | None = None
        self._sock: socket.socket | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._started: dict[int, asyncio.Future] = {}
        self._written: dict[int, asyncio.Future] = {}
        self._ended: dict[int, asyncio.Future] = {}
        self._ids = itertools.count(1)
        self.base_env = dict(os.environ)     # the launcher's: each launch sends what differs
        self.dead = False
        self.opening = asyncio.ensure_future(self._open())

    async def _open(self) -> None:
        mine, theirs = socket.socketpair()
        try:
            self.process = await asyncio.create_subprocess_exec(
                sys.executable, "-S", LAUNCHER, "--fd", str(theirs.fileno()), pass_fds=(theirs.fileno(),),
                env=self.base_env, start_new_session=True)   # a terminal's Ctrl-C to the agent is not for it
        except BaseException:
            self.dead = True
            mine.close()
            raise
        finally:
            theirs.close()
        self._sock = mine
        reader, self._writer = await asyncio.open_connection(sock=mine)
        asyncio.ensure_future(self._read(reader))

    async def launch(self, settings: dict, env: dict[str, str], cwd: str) -> ShimProcess:
        """Fork a shim with ``settings`` (``shim.run``'s arguments); OSError when the
        launcher cannot."""
        if self.dead:
            raise OSError("the shim launcher is gone")
        launch = next(self._ids)
        started, written, ended = self.loop.create_future(), self.loop.create_future(), self.loop.create_future()
        self._started[launch], self._written[launch], self._ended[launch] = started, written, ended
        base = self.base_env
        changed = {name: value for name, value in env.items() if base.get(name) != value}
        unset = [name for name in base if name not in env]
        self._writer.write(json.dumps({"id": launch, "shim": settings, "env": changed, "unset": unset,
                                       "cwd": cwd}).encode() + b"\n")
        reply = await started
        if "error" in reply:
            self._ended.pop(launch, None)
            self._written.pop(launch, None)
            raise OSError(reply["error"])
        return ShimProcess(reply["pid"], reply.get("start"), ended, written)

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while line := await reader.readline():
                message = json.loads(line)
                launch = message["id"]
                if "code" in message:
                    future = self._ended.pop(launch, None)
                    if future is not None and not future.done():
                        future.set_result(message["code"])
                elif "written" in message:
                    future = self._written.pop(launch, None)
                    if future is not None and not future.done():
                        future.set_result({"pid": message["pid"]} if message.get("pid") else True)
                else:
                    future = self._started.pop(launch, None)
                    if future is not None and not future.done():
                        future.set_result(message)
        except (OSError, ValueError):
            pass
        finally:
            self._lost()

    def _lost(self) -> None:
        """The launcher is gone: no start nor end will be reported any more."""
        self.dead = True
        for future in self._started.values():
            if not future.done():
                future.set_exception(OSError("the shim launcher died before starting the worker shim"))
        for futures, result in ((self._ended, LOST), (self._written, False)):
            for future in futures.values():
                if not future.done():
                    future.set_result(result)
        for futures in (self._started, self._written, self._ended):
            futures.clear()
        if self.process is not None:
            asyncio.ensure_future(self.process.wait())   # reap it

    def close(self) -> None:
        """Let the launcher go (it exits on end of file; its shims run on)."""
        self.dead = True
        if self._writer is not None:
            self._writer.close()
        elif self._sock is not None:
            self._sock.close()


_current: Launcher | None = None


async def launcher() -> Launcher:
    """This process's launcher, started (again) when there is none on this event loop."""
    global _current
    loop = asyncio.get_running_loop()
    if _current is not None and not _current.dead and _current.loop is loop:
        await asyncio.shield(_current.opening)   # launches that came meanwhile share one launcher
        return _current
    if _current is not None:
        try:
            _current.close()
        except RuntimeError:      # its event loop is closed: the socket goes with it
            if _current._sock is not None:
                _current._sock.close()
    _current = Launcher()
    await asyncio.shield(_current.opening)
    return _current


def close() -> None:
    """End this process's launcher (if any), as the agent's own end would."""
    global _current
    if _current is not None:
        _current.close()
        _current = None


async def shutdown(timeout: float = 5.0) -> None:
    """The agent's clean stop: end this process's launcher and reap it (its shims run on,
    fenced by the lease), so no launcher outlives its agent, not even as a zombie."""
    current = _current
    close()
    if current is None or current.loop is not asyncio.get_running_loop():
        return
    if not current.opening.done():
        await asyncio.wait([current.opening], timeout=timeout)
    if current.process is not None:
        try:
            await asyncio.wait_for(current.process.wait(), timeout)
        except asyncio.TimeoutError:      # it does not read its end of the socket: make it go
            current.process.kill()
            await current.process.wait()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] != "--fd" or not args[1].isdigit():
        print("usage: launcher.py --fd N", file=sys.stderr)
        return 2
    serve(socket.socket(fileno=int(args[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
