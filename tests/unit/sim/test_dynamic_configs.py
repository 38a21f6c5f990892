"""The dynamic simulator's configurations by name, and its waits by job size."""
from __future__ import annotations

import dataclasses
import math

import pytest

from gpusched.config import DEFAULT_PLACEMENT, PlacerSettings
from gpusched.policies.queueing.quota import QueueTree
from gpusched.policies.scheduler import SchedulerConfig
from gpusched.sim import dynamic_report
from gpusched.sim.dynamic_configs import parse_config
from gpusched.sim.metrics import JobRecord, SimResult, size_of, summarize
from gpusched_placer.main import scheduler_config


def config(text: str) -> SchedulerConfig:
    return parse_config(text, QueueTree(), 1800.0, 7200.0)[1]


def test_defaults_are_what_the_placer_runs_with_unless_told():
    # The placer's settings with nothing given, the queue's half-life and aging being the
    # simulator's own options: the placement too, so that a new default reaches both. Not
    # the placer's bound on a cycle's time (a simulation decides by no clock) nor the
    # shorter head that bound goes with: the scheduler's.
    placer = scheduler_config(PlacerSettings())
    assert placer.max_cycle_s < math.inf
    unbounded = SchedulerConfig()
    assert config("defaults") == dataclasses.replace(
        placer, half_life_s=1800.0, aging_s=7200.0, max_cycle_s=math.inf, min_job_test=unbounded.min_job_test,
        job_test_head=unbounded.job_test_head)
    assert config("defaults").placement == DEFAULT_PLACEMENT == "best-fit"
    assert config("defaults+depth=4").reservation_depth == 4


@pytest.mark.parametrize("text, backfill, reserve_after_s, depth", [
    ("fair-share+best-fit", False, math.inf, 2),             # named configurations reserve nothing unless told
    ("fair-share+best-fit+backfill", True, math.inf, 2),     # EASY: the first blocked job, at once
    ("fifo+fgd+backfill=60", False, 3600.0, 1),              # the first blocked job that waited an hour
    ("priority+best-fit+reserve=5+depth=3", False, 300.0, 3),
    ("priority+best-fit+backfill+reserve=5", True, 300.0, 2),
])
def test_named_reservations(text, backfill, reserve_after_s, depth):
    c = config(text)
    assert (c.backfill, c.reserve_after_s, c.reservation_depth) == (backfill, reserve_after_s, depth)


@pytest.mark.parametrize("text", ["fifo+best-fit+reserve", "fifo+best-fit+depth", "fifo+best-fit+later=5"])
def test_an_unknown_or_empty_flag_is_refused(text):
    with pytest.raises(ValueError, match="unknown flag"):
        config(text)


@pytest.mark.parametrize("milli, workers, size", [
    (500, 1, "1"), (1000, 1, "1"), (2000, 1, "2-4"), (4000, 1, "2-4"), (8000, 1, "8"),
    (16_000, 2, "multi-node"), (2000, 2, "multi-node"),
])
def test_size_of(milli, workers, size):
    assert size_of(milli, workers) == size


def test_waits_by_size_take_the_worst_and_count_who_never_ran():
    jobs = [JobRecord("a", "t", 1000, 1, 0.0, 10.0, 20.0), JobRecord("b", "t", 1000, 1, 0.0, 30.0, 40.0),
            JobRecord("g", "t", 16_000, 2, 5.0, 505.0, 600.0), JobRecord("w", "t", 8000, 1, 0.0, None, None)]
    result = SimResult("w", "c", 16_000, ("t",), (16_000.0,), jobs=jobs)
    by_size = summarize(result)["waits_by_size"]
    assert by_size["1"]["max"] == 30.0 and by_size["1"]["jobs"] == 2
    assert by_size["multi-node"]["max"] == 500.0
    assert by_size["8"] == {"jobs": 1, "p99": None, "max": None, "never_ran": 1}
    assert by_size["2-4"]["jobs"] == 0
    table = dynamic_report.size_table([summarize(result)])
    assert "| 1 worst / p99 | 2-4 worst / p99 | 8 worst / p99 | multi-node worst / p99 |" in table
    assert "| c | 30 / 30 | - / - | - / - | 500 / 500 | 1 |" in table
