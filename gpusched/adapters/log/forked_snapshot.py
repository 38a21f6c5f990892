"""Snapshot bytes made by a forked child, as Redis's BGSAVE does: the loop stops only for
the fork itself.

Copying the state on the loop and encoding the copy in a thread (``capture`` +
``encode_captured``) blocks the loop for the copy, O(jobs): 100-160 ms for a placer
holding ~26k jobs, 730-890 ms for 200k, and the encoding thread then holds the GIL about
half of the 0.5-3 s it runs. Both set the placer's latency tail (bench/submit_bench.py).
After ``fork()`` the child holds a copy-on-write image of the process at that instant,
so the state it encodes is exactly the one at the current offset, and the parent's loop
goes on. The price is memory: the pages the child touches (reference counts) are copied,
up to the size of the state, for as long as the child runs.

The child runs only the pure encoder and leaves with ``os._exit``: it never touches the
event loop, gRPC, Kafka or logging it inherited (their threads did not come along).
"""
from __future__ import annotations

import asyncio
import gc
import os
import signal
import time

from gpusched.core.snapshot import SnapshotError, snapshot_bytes
from gpusched.core.state import ClusterState

CAN_FORK = hasattr(os, "fork")


async def snapshot_bytes_forked(state: ClusterState) -> tuple[bytes, float]:
    """``snapshot_bytes(state)``, computed in a child process; and how long the loop
    was blocked (the fork)."""
    read_end, write_end = os.pipe()
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:   # the child
        _encode_and_exit(state, read_end, write_end)
    blocked_s = time.perf_counter() - t0
    os.close(write_end)
    loop = asyncio.get_running_loop()
    try:
        data = await loop.run_in_executor(None, _read_all, read_end)
    finally:
        _, status = await loop.run_in_executor(None, os.waitpid, pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise SnapshotError(f"snapshot child {pid} failed (exit status {code})")
    return data, blocked_s


def _encode_and_exit(state: ClusterState, read_end: int, write_end: int) -> None:
    code = 1
    try:
        os.close(read_end)
        # A SIGTERM to the process group must end this child, not reach the parent's
        # loop through the signal wake-up fd both share.
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
        gc.disable()   # a collection would touch (and so copy) every page of the heap
        view = memoryview(snapshot_bytes(state))
        while view:
            view = view[os.write(write_end, view):]
        code = 0
    finally:
        os._exit(code)


def _read_all(fd: int) -> bytes:
    chunks = []
    try:
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)
