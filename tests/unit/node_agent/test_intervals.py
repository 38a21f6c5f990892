"""The record checker: intervals from the recorder's lines, and overlapping attempts."""
from __future__ import annotations

import json

import pytest

from tests.workloads.intervals import Interval, overlaps, read_records


def iv(gpu, job, attempt, start, end, worker=0):
    return Interval(gpu, job, attempt, worker, start, end)


A0 = iv("g0", "a", 0, 0.0, 10.0)
A1 = iv("g0", "a", 1, 9.0, 20.0)          # a's next attempt, started before attempt 0 was gone
A1_LATE = iv("g0", "a", 1, 10.0, 20.0)    # ... started as attempt 0 ended
A0_W1 = iv("g0", "a", 0, 2.0, 5.0, worker=1)
B = iv("g0", "b", 0, 5.0, 6.0)
B_OTHER_GPU = iv("g1", "b", 0, 5.0, 6.0)
C_INSIDE_LONG = iv("g0", "c", 0, 30.0, 31.0)
LONG = iv("g0", "d", 0, 25.0, 40.0)


@pytest.mark.parametrize("intervals, expected", [
    ([], []),
    ([A0], []),
    ([A0, A1], [(A0, A1)]),
    ([A1, A0], [(A0, A1)]),                     # order of input does not matter
    ([A0, A1_LATE], []),                        # touching ends do not overlap
    ([A0, A0_W1], []),                          # same attempt: not a conflict
    ([A0, B], [(A0, B)]),                       # another job on the GPU
    ([A0, B_OTHER_GPU], []),                    # another GPU
    ([LONG, C_INSIDE_LONG], [(LONG, C_INSIDE_LONG)]),   # wholly inside
    ([A0, A1, B], [(A0, B), (A0, A1)]),         # B ended before A1 began
])
def test_overlaps(intervals, expected):
    assert overlaps(intervals) == expected


def test_read_records_uses_the_end_or_else_the_last_tick(tmp_path):
    lines = [
        {"event": "start", "t": 1.0, "pid": 10, "gpus": "g0,g1", "job": "a", "attempt": 0, "worker": 0},
        {"event": "start", "t": 2.0, "pid": 11, "gpus": "g0", "job": "a", "attempt": 1, "worker": 0},
        {"event": "tick", "t": 3.0, "pid": 10},
        {"event": "tick", "t": 4.0, "pid": 11},
        {"event": "end", "t": 5.0, "pid": 11, "how": "term"},
    ]
    (tmp_path / "w").mkdir()
    text = "".join(json.dumps(r) + "\n" for r in lines) + '{"event": "tick", "t": 9'   # cut short by SIGKILL
    (tmp_path / "w" / "record.jsonl").write_text(text)
    got = read_records(tmp_path)
    assert got == [Interval("g0", "a", 0, 0, 1.0, 3.0), Interval("g1", "a", 0, 0, 1.0, 3.0),
                   Interval("g0", "a", 1, 0, 2.0, 5.0)]
    assert overlaps(got) == [(got[0], got[2])]
    assert read_records([tmp_path / "w" / "record.jsonl"]) == got
