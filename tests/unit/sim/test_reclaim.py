"""Borrow and reclaim between two and three teams of mixed job sizes, on the production
scheduler and preemptor policy (``gpusched.sim.reclaim``): preemption settles.

Seeded random workloads (the simulator's ``random.Random(seed)``): demand changes at random
for four hours, then is steady for four."""
from __future__ import annotations

import functools

import pytest

from gpusched.sim.reclaim import Preempted, ReclaimReport, ReclaimWorkload, run

WINDOW_S = 600.0     # PreemptionConfig.reclaim_window_s's default


def test_flips_count_a_reclaim_back_between_the_same_two_teams():
    r = ReclaimReport(hours=1.0, steady_from_s=100.0, preemptions=[
        Preempted(10, "j1", "b", "a", "reclaim"),
        Preempted(20, "j2", "a", "b", "reclaim"),       # flip (before steady demand)
        Preempted(30, "j3", "c", "a", "reclaim"),       # another pair
        Preempted(40, "j4", "a", "b", "priority"),      # not a reclaim
        Preempted(100, "j5", "b", "a", "reclaim"),      # flip; the first once steady
        Preempted(200, "j6", "a", "b", "reclaim"),      # flip, also once steady
        Preempted(300, "j1", "b", "a", "reclaim"),      # and again
    ])
    assert r.flips() == 4
    assert r.flips(since=100.0) == 2
    assert r.repeated_within(WINDOW_S) == ["j1"] and r.repeated_within(200.0) == []
    assert r.per_hour() == 7


SEEDS = range(6)


@functools.lru_cache(maxsize=None)
def report(teams: int, seed: int, departures: bool) -> ReclaimReport:
    return run(ReclaimWorkload(teams=teams, seed=seed, departures_when_steady=departures))


@pytest.mark.parametrize("departures", [True, False])
@pytest.mark.parametrize("teams", [2, 3])
def test_the_workload_borrows_and_reclaims(teams, departures):
    # What the tests below assert is about reclaims: the seeds must make some.
    assert sum(len(report(teams, seed, departures).reclaims()) for seed in SEEDS) >= 5


@pytest.mark.parametrize("teams", [2, 3])
@pytest.mark.parametrize("seed", SEEDS)
def test_reclaims_settle_once_demand_is_steady(teams, seed):
    r = report(teams, seed, departures=False)
    assert r.flips(since=r.steady_from_s) == 0
    # The answer to the change of demand comes within two cycles' worth of minutes; then
    # nothing is preempted any more.
    assert all(p.time <= r.steady_from_s + 10 * 60.0 for p in r.preemptions if p.time >= r.steady_from_s)
    assert r.repeated_within(WINDOW_S) == []


@pytest.mark.parametrize("teams", [2, 3])
@pytest.mark.parametrize("seed", SEEDS)
def test_no_flips_once_steady_while_jobs_keep_ending(teams, seed):
    # Capacity that jobs free while demand is steady stays with the team below its
    # guarantee that waits for it (the guarantee hold, claims_guarantee), and a reclaim's
    # beneficiary takes what was freed for it (the nomination binds): nothing is lent only
    # to be reclaimed back.
    r = report(teams, seed, departures=True)
    assert r.flips(since=r.steady_from_s) == 0


@pytest.mark.parametrize("teams", [2, 3])
@pytest.mark.parametrize("seed", SEEDS)
def test_no_job_is_reclaimed_twice_within_the_window(teams, seed):
    assert report(teams, seed, departures=True).repeated_within(WINDOW_S) == []
