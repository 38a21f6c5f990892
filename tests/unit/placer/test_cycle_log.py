"""``--cycle-log``: a line per scheduling cycle with its exact durations, what it held and
placed; the idle rounds that run no cycle write nothing."""
from __future__ import annotations

import gc
import time

from gpusched.adapters.log.gc_pacing import GcClock
from gpusched.core import events as ev
from gpusched.policies.scheduler import Scheduler
from gpusched_placer import cycle_log
from gpusched_placer.cycle_log import CycleLog
from gpusched_placer.loop import PlacementDecider
from tests.unit.core.builders import Log, make_node, make_spec


def test_each_cycle_is_a_line_with_its_durations_and_counts(tmp_path):
    path = str(tmp_path / "cycles.txt")
    log = Log(make_node("n1", gpus=4))
    for i, gpus in enumerate((2, 2, 8)):   # two fit, one never does
        log(ev.JobSubmitted, job_id=f"j{i}", spec=make_spec(gpus=gpus))
    decider = PlacementDecider(Scheduler(), "placer-test", CycleLog.open(path))
    placed = [e for e, _ in decider(0, log.state, 100.0) if isinstance(e, ev.JobPlaced)]
    assert decider(0, log.state, 100.5) == []   # the same state: no cycle, no line
    decider.cycle_log.close()
    (line,) = cycle_log.read(path)
    assert (line["partition"], line["pending"], line["placed"]) == (0, 3, len(placed)) and len(placed) == 2
    assert line["wall_ms"] > 0 and line["cpu_ms"] >= 0 and line["gc_ms"] >= 0 and line["reasons_ms"] >= 0
    assert abs(line["time"] - time.time()) < 60


def test_the_gc_clock_counts_collections_only_while_installed():
    clock = GcClock().install()
    try:
        gc.collect()
        assert clock.paused_s > 0 and clock.full_collections == 1
        gc.collect(0)
        assert clock.full_collections == 1
    finally:
        clock.uninstall()
    paused = clock.paused_s
    gc.collect()
    assert clock.paused_s == paused
