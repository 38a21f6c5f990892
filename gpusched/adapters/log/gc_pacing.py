"""Short pauses from the cyclic GC in a long-running service: freeze after each full
collection.

A service's state only grows between compactions (every job, node and dedupe id is a
handful of long-lived objects), and CPython runs a full (generation 2) collection each
time the long-lived heap has grown by a quarter, rescanning *all* of it. Measured on the
bench cluster after ~25k jobs (bench/submit_bench.py with a loop-lag probe): full
collections of 90-250 ms in every service, one every ~10 s while jobs arrive, and they
set submit->placed p99 at 200 jobs/s.

Right after a full collection every object still tracked is reachable, so moving them all
to the permanent generation (``gc.freeze``) loses nothing: frozen objects are still freed
by reference counting when dropped; only a cycle that forms among them *later* and then
becomes garbage waits. The next full collection then scans just what was allocated since
(same VM: admission's full collections 4-21 ms instead of 90-165 ms). Measured: the
cyclic garbage left after unfreezing at exit was the same with and without freezing
(~104k objects, the shutdown itself), so the frozen cycles are few; to bound them anyway,
once every ``thaw_every_s`` the permanent generation is handed back, so one full
collection sees everything again.
"""
from __future__ import annotations

import asyncio
import gc
import time
from contextlib import contextmanager
from typing import Iterator, Self

THAW_EVERY_S = 3600.0
OLDEST = 2   # CPython's generations: 0, 1, 2


class _GcCallback:
    """Hooked into ``gc.callbacks`` from ``install`` until ``uninstall``."""

    def install(self) -> Self:
        gc.callbacks.append(self._on_gc)
        return self

    def uninstall(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def _on_gc(self, phase: str, info: dict) -> None:
        raise NotImplementedError


class GcPacer(_GcCallback):
    def __init__(self, loop: asyncio.AbstractEventLoop, thaw_every_s: float = THAW_EVERY_S,
                 clock=time.monotonic) -> None:
        self._loop = loop
        self._thaw_every_s = thaw_every_s
        self._clock = clock
        self._thawed_at = clock()
        self.freezes = 0
        self.thaws = 0

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase != "stop" or info["generation"] != OLDEST:
            return
        # Not inside the collector's callback (it runs in whichever thread allocated):
        # on the loop, right after.
        try:
            self._loop.call_soon_threadsafe(self._after_full_collection)
        except RuntimeError:   # loop closed: the process is ending
            pass

    def _after_full_collection(self) -> None:
        if self._clock() - self._thawed_at >= self._thaw_every_s:
            gc.unfreeze()       # the next full collection rescans everything, once
            self._thawed_at = self._clock()
            self.thaws += 1
        else:
            gc.freeze()
            self.freezes += 1


def pace_gc(loop: asyncio.AbstractEventLoop | None = None) -> GcPacer:
    """Install the pacer for this process's event loop (services call this once)."""
    return GcPacer(loop or asyncio.get_running_loop()).install()


# --- replay ---------------------------------------------------------------------------
# While a follower replays (big batches), the cyclic GC is paused across each fetch and
# fold and runs between batches. Everything a batch allocates either dies by reference
# count or joins the state for good, so collecting in the middle of a batch only rescans
# the growing state.
GC_PAUSE_MIN = 1000   # batches at least this big (a replay) are fetched and folded with the GC paused


@contextmanager
def gc_paused(pause: bool = True) -> Iterator[None]:
    """The cyclic GC off for the block when ``pause`` (and not already off)."""
    paused = pause and gc.isenabled()
    if paused:
        gc.disable()
    try:
        yield
    finally:
        if paused:
            gc.enable()


# --- measuring ------------------------------------------------------------------------
class GcClock(_GcCallback):
    """Seconds the cyclic GC has held this process so far (``paused_s``), to tell a
    long scheduling cycle's collections from its own work (the placer's cycle log)."""

    def __init__(self, clock=time.perf_counter) -> None:
        self._clock = clock
        self._began: float | None = None
        self.paused_s = 0.0
        self.full_collections = 0

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._began = self._clock()
        elif self._began is not None:
            self.paused_s += self._clock() - self._began
            self._began = None
            self.full_collections += info["generation"] == OLDEST
