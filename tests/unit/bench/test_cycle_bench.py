"""bench/cycle_bench.py's measured cycles (``Measured``): with ``--pause-gc`` each cycle
runs with the cyclic GC off, as the placer runs it, and on again after; the report names
the longest cycles with their decisions and gangs."""
from __future__ import annotations

import argparse
import gc
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[3] / "bench"
sys.path.insert(0, str(BENCH))

import cycle_bench  # noqa: E402
from gpusched.core.model import WorkerAssignment  # noqa: E402
from gpusched.policies.scheduler import CycleResult, Decision  # noqa: E402


def worker(i: int) -> WorkerAssignment:
    return WorkerAssignment(worker=i, node=f"node-{i}")


class Recording:
    """A scheduler that records whether the GC was on during each cycle, and decides
    ``workers`` (one decision a cycle) as it is told."""

    def __init__(self, workers: list[int]) -> None:
        self.workers, self.gc_on = list(workers), []

    def schedule(self, state, now, memory) -> CycleResult:
        self.gc_on.append(gc.isenabled())
        n = self.workers.pop(0)
        decision = Decision(f"job-{n}", 1, tuple(worker(i) for i in range(n)), "best-fit")
        return CycleResult([decision], {}, [])


def args(pause: bool) -> argparse.Namespace:
    return argparse.Namespace(profile=None, pause_gc=pause)


def test_pause_gc_runs_each_cycle_with_the_gc_off_and_turns_it_on_after():
    assert gc.isenabled()
    scheduler = Recording([1, 1])
    measured = cycle_bench.Measured(scheduler, args(True))
    measured.schedule(None, 0.0, None)
    assert gc.isenabled()
    measured.schedule(None, 0.0, None)
    assert scheduler.gc_on == [False, False]
    assert gc.isenabled()


def test_without_pause_gc_the_gc_stays_on():
    scheduler = Recording([1])
    cycle_bench.Measured(scheduler, args(False)).schedule(None, 0.0, None)
    assert scheduler.gc_on == [True]


def test_report_counts_decisions_and_names_the_longest_cycles_with_their_gangs(capsys):
    measured = cycle_bench.Measured(Recording([1, 3, 1, 2]), args(True))
    for _ in range(4):
        measured.schedule(None, 0.0, None)
    measured.ms[:] = [5.0, 40.0, 7.0, 20.0]   # the CPU times, made distinct
    measured.longest = [(ms, n, g) for ms, (_, n, g) in zip(measured.ms, measured.longest)]
    measured.report("what")
    first, longest = capsys.readouterr().out.splitlines()
    assert first.startswith("what: 18.00 ms CPU per cycle (p50 20.00, p99 40.00, max 40.00; 1.0 decisions per cycle, "
                            "4 cycles, GC paused)")
    assert longest == "longest: 40.0 ms (1 decisions, 1 gangs), 20.0 ms (1 decisions, 1 gangs), " \
                      "7.0 ms (1 decisions, 0 gangs)"
