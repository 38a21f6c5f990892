"""Borrow and reclaim between two and three teams of mixed job sizes, on the production
scheduler and preemptor policy (``gpusched.sim.reclaim``): preemption settles.

Seeded random workloads (the simulator's ``random.Random(seed)``): demand changes at random
for four hours, then is steady for four."""
from __future__ import annotations

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


@pytest.mark.parametrize("teams", [2, 3])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_reclaims_settle_once_demand_is_steady(teams, seed):
    wl = ReclaimWorkload(teams=teams, seed=seed, departures_when_steady=False)
    r = run(wl)
    assert r.reclaims(), "the workload must make teams borrow and reclaim"
    assert r.flips(since=r.steady_from_s) == 0
    # The answer to the change of demand comes within two cycles' worth of minutes; then
    # nothing is preempted any more.
    assert all(p.time <= r.steady_from_s + 10 * wl.step_s for p in r.preemptions if p.time >= r.steady_from_s)
    assert r.repeated_within(WINDOW_S) == []


@pytest.mark.parametrize("teams", [2, 3])
@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_no_job_is_reclaimed_twice_within_the_window(teams, seed):
    r = run(ReclaimWorkload(teams=teams, seed=seed))
    assert r.reclaims()
    assert r.repeated_within(WINDOW_S) == []
