"""The fault rig's checker (tests/rig/checker.py) on made-up records: two copies of one
attempt's worker alive at once are a double run, one after the other are not."""
from __future__ import annotations

from tests.rig.checker import _pct, double_runs
from tests.workloads.intervals import Interval


def run(start: float, end: float, gpu: str = "g0", attempt: int = 0) -> Interval:
    return Interval(gpu, "job-1", attempt, 0, start, end)


def test_two_copies_of_one_attempt_at_once_are_a_double_run():
    assert double_runs([run(0, 5), run(4, 8, gpu="g1")]) != []


def test_copies_one_after_the_other_and_other_attempts_are_not():
    assert double_runs([run(0, 5), run(5.5, 8, gpu="g1")]) == []
    assert double_runs([run(0, 5), run(1, 8, attempt=1)]) == []   # attempts_overlap's concern, not this one


def test_percentiles_interpolate():
    assert _pct([1.0, 2.0, 3.0], 50) == 2.0
    assert _pct([1.0, 3.0], 50) == 2.0
    assert _pct([4.0], 99) == 4.0
