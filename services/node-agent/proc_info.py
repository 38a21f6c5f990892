"""What Linux's /proc says about processes: a process's state and start (which tells it
from a later process with the same pid), and this boot's id (pids recorded in another
boot mean nothing now). The worker shim (``shim.c``) records both in its status file;
the agent reads them back (``leftovers``)."""
from __future__ import annotations

import os

_boot_id = ""


def boot_id() -> str:
    """This boot's id, "" where there is none (not Linux); read once per process."""
    global _boot_id
    if not _boot_id:
        try:
            with open("/proc/sys/kernel/random/boot_id") as f:
                _boot_id = f.read().strip()
        except OSError:
            return ""
    return _boot_id


def oom_kills() -> int | None:
    """How many processes the kernel's out-of-memory killer has ended since boot (a host's
    or a memory cgroup's OOM alike: /proc/vmstat ``oom_kill``); None where it is not kept."""
    try:
        with open("/proc/vmstat", "rb") as f:
            for line in f:
                if line.startswith(b"oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def proc_stat(pid: int) -> tuple[str, int] | None:
    """``pid``'s state letter and when it started (clock ticks since boot); None when it
    is gone or there is no /proc."""
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
