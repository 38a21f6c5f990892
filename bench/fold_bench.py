"""Benchmark: the reducer stage of a replay (``replay_stages.py``'s third stage) without a
broker: the pool workload (``pool_workload.py``) is generated in memory (or loaded from
``--events``, a pickle written by ``--save``), then folded into fresh states with the
cyclic GC off, best of ``--repeat``. Per event, in µs. For a before/after comparison of a
reducer change, save the events once and fold the same file with both builds.

    .venv/bin/python bench/fold_bench.py --count 200000 --save /tmp/events.pkl
    .venv/bin/python bench/fold_bench.py --events /tmp/events.pkl

With ``--snapshot``, also the end state's snapshot: its size, the time to write and to
restore it, side by side with the same state's snapshot carrying the reducer's journal of
changed jobs, as snapshots did before it was left out (``gpusched.core.snapshot``).
"""
from __future__ import annotations

import argparse
import gc
import math
import pickle
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.pool_workload import PoolSim  # noqa: E402
from gpusched import native  # noqa: E402
from gpusched.core.digest import digest  # noqa: E402
from gpusched.core import snapshot as snap  # noqa: E402
from gpusched.core.reducer import apply  # noqa: E402
from gpusched.core.state import ClusterState  # noqa: E402


def fold(events: list) -> tuple[float, ClusterState]:
    state = ClusterState()
    gc.disable()
    started = time.process_time()
    for e in events:
        apply(state, e)
    elapsed = time.process_time() - started
    gc.enable()
    return elapsed, state


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--count", type=int, default=200_000)
    p.add_argument("--nodes", type=int, default=2000)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--events", default="", help="fold these (a pickle from --save) instead of generating")
    p.add_argument("--save", default="", help="write the generated events here")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--snapshot", action="store_true", help="also time the end state's snapshot")
    args = p.parse_args()
    if args.events:
        events = pickle.loads(Path(args.events).read_bytes())
    else:
        sim = PoolSim(args.seed, args.nodes)
        sim.run(args.count)
        events = sim.events
        if args.save:
            Path(args.save).write_bytes(pickle.dumps(events))
    best, state = min((fold(events) for _ in range(args.repeat)), key=lambda r: r[0])
    print(f"reducer ({native.status}): {len(events)} events, {1e6 * best / len(events):.3f} µs/event "
          f"(best of {args.repeat}); applied {state.applied}, rejected {state.rejected}; "
          f"digest {digest(state)[:16]}")
    if args.snapshot:
        snapshot_figures(state, args.repeat)


def with_journal(state: ClusterState) -> bytes:
    """``state``'s snapshot as written while snapshots carried the journal's entries."""
    doc = snap.snapshot_doc(state)
    journal = snap._column(list[str])
    doc["schema"]["ClusterState"].append("changes")
    doc["state"]["changes"] = journal.render(journal.capture([state.changes]))
    doc["state"]["changes_base"] = [state.changes_base]
    return snap.encode_doc(doc)


def timed(work) -> tuple[float, object]:
    """CPU seconds of ``work`` (this process's: on a shared machine wall time measures
    the load too) with the cyclic GC off, and its result."""
    gc.disable()
    started = time.process_time()
    result = work()
    elapsed = time.process_time() - started
    gc.enable()
    return elapsed, result


def snapshot_figures(state: ClusterState, repeat: int) -> None:
    """Both kinds written and restored in turn, ``repeat`` rounds, the order swapped
    every round (a load change hits both alike); best of each."""
    print(f"end state: {len(state.jobs):,} jobs, journal of {len(state.changes):,} entries")
    kinds = (("journal left out", snap.snapshot_bytes), ("journal written", with_journal))
    best: dict[str, list[float]] = {name: [math.inf, math.inf] for name, _ in kinds}
    size: dict[str, int] = {}
    for round_ in range(repeat):
        for name, write in kinds if round_ % 2 == 0 else kinds[::-1]:
            t_write, blob = timed(lambda: write(state))
            t_read, restored = timed(lambda: snap.state_from_snapshot(blob))
            assert digest(restored) == digest(state)
            size[name] = len(blob)
            best[name] = [min(best[name][0], t_write), min(best[name][1], t_read)]
    for name, _ in kinds:
        print(f"  {name}: {size[name] / 2**20:.2f} MiB, write {1e3 * best[name][0]:.0f} ms, "
              f"restore {1e3 * best[name][1]:.0f} ms CPU (best of {repeat}, alternated)")


if __name__ == "__main__":
    main()
