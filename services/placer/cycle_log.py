"""A line per scheduling cycle (``--cycle-log``), for benchmarks: the exact durations
behind the cycle histogram's buckets, split so that a long cycle can be told apart:

    time partition wall_ms cpu_ms gc_ms pending placed reasons_ms

``wall_ms`` is what the histogram records (the cycle and its ``JobPlaced`` events);
``cpu_ms`` the placer's CPU meanwhile (wall minus CPU: the machine's other processes);
``gc_ms`` the cyclic GC's pauses inside it; ``reasons_ms`` the pending-reasons pass that
follows it, before the placements are appended.
"""
from __future__ import annotations

import time
from typing import TextIO

from gpusched.adapters.log.gc_pacing import GcClock

FIELDS = ("time", "partition", "wall_ms", "cpu_ms", "gc_ms", "pending", "placed", "reasons_ms")


class CycleLog:
    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._gc = GcClock().install()
        self._cpu = self._gc_then = 0.0   # at start(); from ended(): the cycle's own

    @classmethod
    def open(cls, path: str) -> "CycleLog | None":
        return cls(open(path, "a", buffering=1)) if path else None   # a line each: readable while it runs

    def start(self) -> None:
        self._cpu, self._gc_then = time.thread_time(), self._gc.paused_s

    def ended(self) -> None:
        """The cycle's end (before the pending reasons): its CPU and GC so far."""
        self._cpu, self._gc_then = time.thread_time() - self._cpu, self._gc.paused_s - self._gc_then

    def done(self, partition: int, wall_s: float, pending: int, placed: int, reasons_s: float) -> None:
        cpu_s, gc_s = self._cpu, self._gc_then
        self._out.write(f"{time.time():.3f} {partition} {wall_s * 1e3:.2f} {cpu_s * 1e3:.2f} {gc_s * 1e3:.2f} "
                        f"{pending} {placed} {reasons_s * 1e3:.2f}\n")

    def close(self) -> None:
        self._gc.uninstall()
        self._out.close()


def read(path: str) -> list[dict[str, float]]:
    """The lines written so far, as dicts of ``FIELDS``."""
    with open(path) as lines:
        return [dict(zip(FIELDS, map(float, line.split()))) for line in lines if len(line.split()) == len(FIELDS)]
