"""The worker supervisor ("shim"): one small process per worker, between the node-agent
and the workload, that ends the workload on its own when the node's lease runs out.

    python -m gpusched_node_agent.shim --lease PATH --kill-wait S --status PATH [--poll S] -- CMD ARGS...

(or ``python .../shim.py ...``: the node-agent starts it by file path, so it runs where
the package is not installed.)

* Starts CMD in a new session (its own process group, whose id is its pid) with the
  environment and working folder the shim was given.
* Writes the status file (JSON, replaced atomically) right after the start:
  ``shim_pid, pid, pgid, started_at, boot_id, shim_start, pid_start, ...``; at the end
  it adds ``ended_at, exit_code, signal, fenced, reason`` (``exit_code`` is the
  workload's code, ``None`` when a signal ended it; ``signal`` is that signal or 0).
  A workload that cannot start gets ``pid: None`` and exit code 127.
* SIGTERM or SIGINT to the shim: SIGTERM to the workload's group, SIGKILL to the group
  ``--kill-wait`` seconds later if it is still there.
* Fencing: the shim reads the lease (``lease.py``) and sleeps until its expiry or the
  poll interval, whichever is sooner (the agent may renew or revoke it meanwhile). Once
  ``time.time()`` passes the expiry it stops the group the same way and marks the end
  ``fenced``. Hence the bound the scheduler relies on to place the job elsewhere:

      a workload never runs past  lease expiry + kill_wait + poll

  (plus the moment the kernel takes to deliver SIGKILL). A lease that has already
  expired when the shim starts means the workload is never started.
* When the workload's leader exits, whatever is left of its process group is stopped
  the same way; the shim exits once the whole group is gone, with a code that mirrors
  the workload's (128 + signal when a signal ended it).

The shim depends on nothing from the agent after it starts: it is in its own session
and keeps working (and fencing) when the agent is frozen (SIGSTOP) or killed. It also
makes itself the child subreaper (Linux), so the workload's orphaned children are
reaped here and never linger as zombies that would look like a live group. A process
that leaves the group (its own ``setsid``) escapes the shim; containing that takes a
cgroup. Standard library only, so it starts fast.
"""
from __future__ import annotations

import json
import math
import os
import select
import signal
import sys
import time

TYPE_CHECKING = False   # typing is not imported at run time: the shim starts fast
if TYPE_CHECKING:
    from typing import Callable

if __package__:
    from .lease import read_expiry
else:   # run as a file (the package need not be installed): lease.py sits beside it
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from lease import read_expiry

EXIT_NOT_STARTED = 127
PR_SET_CHILD_SUBREAPER = 36
try:   # the C function: signal.signal's wrapper maps to and from enums, Python code that a
    # forked shim would page in (copy on write) only to set three handlers
    from _signal import SIG_DFL, signal as set_handler
except ImportError:
    from signal import SIG_DFL, signal as set_handler
_IGNORED_BY_PYTHON = tuple(getattr(signal, name) for name in ("SIGPIPE", "SIGXFSZ") if hasattr(signal, name))


_boot_id = ""


def boot_id() -> str:
    """This boot's id (Linux): pids recorded in another boot mean nothing now. Read once
    per process (a launcher's forked shims inherit it)."""
    global _boot_id
    if not _boot_id:
        try:
            with open("/proc/sys/kernel/random/boot_id") as f:
                _boot_id = f.read().strip()
        except OSError:
            return ""
    return _boot_id


def proc_stat(pid: int) -> tuple[str, int] | None:
    """``pid``'s state letter and when it started (clock ticks since boot, which tells
    it from a later process with the same pid); None when it is gone or there is no
    /proc (Linux only)."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
        try:
            data = os.read(fd, 4096)   # one read: the kernel renders the whole line at once
        finally:
            os.close(fd)
        fields = data[data.rindex(b")") + 2:].split()   # the name in (...) may hold spaces, any bytes
        return fields[0].decode("ascii"), int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def proc_start(pid: int) -> int | None:
    stat = proc_stat(pid)
    return None if stat is None else stat[1]


def write_json(path: str, data: dict) -> None:
    """Replace ``path`` atomically: a reader sees the old status or the new one."""
    tmp = f"{path}.{os.getpid()}.tmp"
    # os.open/os.write, not open(): no text I/O stack built per write in a forked shim
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
    try:
        view = memoryview(json.dumps(data).encode())   # json.dumps is ASCII (ensure_ascii)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)
    os.replace(tmp, path)


_prctl = None


def prctl():
    """libc's ``prctl`` (Linux), looked up once per process (a launcher's forked shims
    inherit it); None where there is none."""
    global _prctl
    if _prctl is None and sys.platform.startswith("linux"):
        try:
            import ctypes
            _prctl = ctypes.CDLL(None, use_errno=True).prctl
        except (OSError, AttributeError):
            pass
    return _prctl


def _become_subreaper() -> None:
    call = prctl()
    if call is not None:
        call(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    # else orphans go to init (which, in some containers, never reaps them)


def environment(base: dict[str, str], changed: dict[str, str], unset: list[str]) -> dict[str, str]:
    """A forked shim's workload environment: ``base`` (decoded once, in the launcher) with a
    launch's changes. Only PATH goes into this process's own, where posix_spawnp looks."""
    env = base.copy()
    for name in unset:
        env.pop(name, None)
    env.update(changed)
    if env.get("PATH") != os.environ.get("PATH"):
        os.environ.pop("PATH", None)
        os.environ.update({"PATH": env["PATH"]} if "PATH" in env else {})
    return env


class Shim:
    def __init__(self, command: list[str], status: str, lease: str | None, kill_wait: float, poll: float,
                 written: Callable[[int | None], None] | None = None, env: dict[str, str] | None = None,
                 shim_start: int | None = None) -> None:
        self.command, self.status_path, self.lease = command, status, lease
        # Told the workload's pid (None: not started) once the first status is written: the
        # launcher passes it on to the agent, which then neither polls for the file nor,
        # once the workload started, reads it.
        self.written = written
        self.kill_wait, self.poll = kill_wait, poll
        self.env = env   # the workload's environment (None: this process's)
        self.status: dict = {"shim_pid": os.getpid(), "pid": None, "pgid": None, "command": command,
                             "lease": lease, "kill_wait": kill_wait, "poll": poll, "boot_id": boot_id(),
                             "shim_start": shim_start if shim_start is not None else proc_start(os.getpid())}
        self.leader: int | None = None        # waitstatus_to_exitcode of the leader, once reaped
        self.why_stopped = ""                 # "" while nobody asked the group to stop
        self.fenced = False
        self.kill_at: float | None = None
        self.killed = False
        self.term_requested = False

    # --- the loop ---------------------------------------------------------------
    def run(self) -> int:
        wake_r, wake_w = os.pipe()            # signals wake the select() below
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        set_handler(signal.SIGCHLD, lambda *_: None)
        set_handler(signal.SIGTERM, self._on_term)
        set_handler(signal.SIGINT, self._on_term)
        _become_subreaper()
        if not self._start():
            return EXIT_NOT_STARTED
        pid = self.status["pid"]
        while True:
            self._reap(pid)
            if self.leader is not None and not _group_alive(pid):
                break
            now = time.time()
            # one look at the lease per turn (renewals only move it later; a revoke is seen
            # at the next turn, at most ``poll`` away)
            expiry = read_expiry(self.lease) if self.lease and not self.why_stopped else math.inf
            self._check_stop(now, expiry)
            if self.kill_at is not None and not self.killed and now >= self.kill_at:
                self.killed = True
                _signal_group(pid, signal.SIGKILL)
                continue
            if select.select([wake_r], [], [], self._timeout(now, expiry))[0]:
                os.read(wake_r, 512)
        return self._finish()

    def _start(self) -> bool:
        expiry = read_expiry(self.lease) if self.lease else math.inf
        now = time.time()
        if now > expiry:
            self._not_started(f"not started: lease expired at {expiry:.3f}", fenced=True)
            return False
        try:
            # setsid: a group of its own, so a signal to the group reaches its children too
            # setsigdef: Python ignores SIGPIPE (and SIGXFSZ); the workload gets the defaults
            pid = os.posix_spawnp(self.command[0], self.command, self._workload_env(), setsid=True,
                                  setsigdef=_IGNORED_BY_PYTHON)
        except OSError as exc:
            self._not_started(f"cannot start: {exc}", fenced=False)
            return False
        self.status.update(pid=pid, pgid=pid, started_at=now, pid_start=proc_start(pid))
        self._write_first()
        return True

    def _write_first(self) -> None:
        write_json(self.status_path, self.status)
        if self.written is not None:
            self.written(self.status["pid"])

    def _not_started(self, reason: str, fenced: bool) -> None:
        self.status.update(started_at=None, ended_at=time.time(), exit_code=EXIT_NOT_STARTED, signal=0,
                           fenced=fenced, reason=reason)
        self._write_first()

    def _on_term(self, signum, frame) -> None:
        self.term_requested = True

    def _reap(self, pid: int) -> None:
        """Collect every ended child: the leader's status, and orphans we adopted."""
        while True:
            try:
                child, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if child == 0:
                return
            if child == pid:
                self.leader = os.waitstatus_to_exitcode(status)

    def _workload_env(self) -> dict[str, str]:
        return dict(os.environ) if self.env is None else self.env

    def _check_stop(self, now: float, expiry: float) -> None:
        if self.why_stopped:
            return
        if self.term_requested:
            self._stop("stopped on request", now)
        elif now > expiry:
            self.fenced = True
            self._stop(f"fenced: lease expired at {expiry:.3f}", now)
        elif self.leader is not None:
            self._stop("rest of its process group stopped", now)

    def _stop(self, why: str, now: float) -> None:
        self.why_stopped = why
        self.kill_at = now + self.kill_wait
        _signal_group(self.status["pid"], signal.SIGTERM)

    def _timeout(self, now: float, expiry: float) -> float:
        timeout = self.poll if self.why_stopped else min(self.poll, expiry - now)   # inf: no lease
        if self.kill_at is not None and not self.killed:
            timeout = min(timeout, self.kill_at - now)
        return max(0.0, timeout)

    def _finish(self) -> int:
        code = self.leader
        assert code is not None, "the loop ends only once the leader is reaped"
        exit_code, sig = (code, 0) if code >= 0 else (None, -code)
        end = f"exited with code {code}" if sig == 0 else f"killed by signal {sig}"
        if self.killed:
            end += f" (SIGKILL after kill-wait {self.kill_wait:g}s)"
        self.status.update(ended_at=time.time(), exit_code=exit_code, signal=sig, fenced=self.fenced,
                           reason="; ".join(p for p in (self.why_stopped, end) if p))
        write_json(self.status_path, self.status)
        return exit_code if sig == 0 else 128 + sig


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _seconds(field: str, minimum: float, strict: bool):
    import argparse

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{field} must be a number of seconds, got {text!r}")
        if not math.isfinite(value) or value < minimum or (strict and value == minimum):
            raise argparse.ArgumentTypeError(f"{field} must be {'>' if strict else '>='} {minimum:g}, got {text!r}")
        return value
    return parse


def parse_args(argv: list[str] | None) -> "argparse.Namespace":
    # argparse (with gettext and locale) only here: a shim forked by the launcher gets its
    # settings already checked (``run``) and never pays for the import nor the parse.
    import argparse

    parser = argparse.ArgumentParser(prog="gpusched-shim", description=__doc__.splitlines()[0])
    parser.add_argument("--lease", default=None, help="lease file (omitted: never fenced)")
    parser.add_argument("--kill-wait", type=_seconds("--kill-wait", 0.0, False), required=True,
                        help="seconds between SIGTERM and SIGKILL")
    parser.add_argument("--status", required=True, help="status file (JSON)")
    parser.add_argument("--poll", type=_seconds("--poll", 0.0, True), default=0.1,
                        help="longest sleep between looks at the lease")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    args = parser.parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if not args.command:
        parser.error("command: nothing to run after '--'")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run(args.command, args.status, args.lease, args.kill_wait, args.poll)


def run(command: list[str], status: str, lease: str | None, kill_wait: float, poll: float,
        written: Callable[[int | None], None] | None = None, env: dict[str, str] | None = None,
        shim_start: int | None = None) -> int:
    """What ``main`` does with its arguments parsed (the launcher's forked shims start here,
    with settings the agent checked, and ``written``: called with the workload's pid, None
    when it did not start, once the first status is written); the exit code. A forked shim
    also gets its workload's ``env`` (None: this process's) and its own start in clock ticks
    (``shim_start``: the launcher read it already; None: read here)."""
    return Shim(command, status, lease, kill_wait, poll, written, env, shim_start).run()


if __name__ == "__main__":
    sys.exit(main())
