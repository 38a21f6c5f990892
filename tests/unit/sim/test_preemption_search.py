"""How ``gpusched.sim.preemption_search`` judges a run with the preemptor against the run
without one (the goals of docs/design/scheduling-fairness.md, "With the preemptor")."""
from __future__ import annotations

import pytest

from gpusched.sim.preemption_search import judge, met, seeds_of


def summary(waits: dict[str, float], preemptions=(), within=1000.0, jct=100.0, lost=0.0) -> dict:
    return {"classes": {c: {"mean": w} for c, w in waits.items()},
            "preemptions_by": [{"reason": r, "victim_class": v, "for_class": f} for r, v, f in preemptions],
            "within_guarantee_wait_s": {"mean": within}, "jct_s": {"mean": jct},
            "gpu_hours_lost": lost, "capacity_gpu_hours": 1000.0}


WITHOUT = summary({"hi": 1000.0, "tr": 500.0, "be": 200.0, "serve": 10.0}, within=2000.0)


def test_served_is_the_worst_wait_ratio_of_classes_only_preempted_for():
    run = summary({"hi": 600.0, "tr": 900.0, "be": 400.0, "serve": 10.0},
                  [("priority", "tr", "hi"), ("priority", "be", "tr")], jct=105.0, lost=5.0)
    # tr gives as well as takes: only hi counts; no reclaim, so not the guarantee's wait
    assert judge(run, WITHOUT) == {"served": 0.6, "jct": 1.05, "lost": 0.005}
    assert met(judge(run, WITHOUT))


def test_a_reclaim_adds_the_wait_within_guarantees():
    run = summary({"hi": 600.0}, [("priority", "tr", "hi"), ("reclaim", "tr", "tr")], within=2400.0)
    assert judge(run, WITHOUT)["served"] == pytest.approx(1.2)
    assert not met(judge(run, WITHOUT))


def test_waits_within_one_cycle_of_each_other_are_not_judged():
    run = summary({"hi": 600.0, "serve": 14.0}, [("priority", "be", "hi"), ("priority", "be", "serve")])
    assert judge(run, WITHOUT)["served"] == 0.6          # serve: 14 s against 10 s, under a cycle
    run = summary({"hi": 600.0, "serve": 40.0}, [("priority", "be", "hi"), ("priority", "be", "serve")])
    assert judge(run, WITHOUT)["served"] == 4.0


@pytest.mark.parametrize("ratios, ok", [
    ({"served": 0.9, "jct": 1.10, "lost": 0.009}, True),
    ({"served": 1.0, "jct": 1.0, "lost": 0.0}, False),
    ({"served": 0.5, "jct": 1.11, "lost": 0.0}, False),
    ({"served": 0.5, "jct": 1.0, "lost": 0.01}, False),
])
def test_every_goal_must_be_met(ratios, ok):
    assert met(ratios) is ok


def test_seed_ranges():
    assert seeds_of("1-3") == [1, 2, 3] and seeds_of("10,12") == [10, 12]
