"""Preemption that converges: large requests find their victims with the default settings
but for the bound on work lost for a wait (``other_rules``; test_preemption_cost has it),
a reclaim takes no more than its beneficiary needs, never takes a team below its guarantee,
and a job reclaimed once is not reclaimed again within ``reclaim_window_s``.

Clusters are built through the reducer (``Cluster`` of ``test_preemption``); every policy call
checks that it left the state digest unchanged.
"""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpusched.core.model import JobPhase
from gpusched.core.priority import priority_value
from gpusched.policies.preemption.victim_rules import PreemptionConfig
from tests.unit.policies.preemption_configs import other_rules
from tests.unit.policies.preemption_clusters import BE, HI, NOW, PROD, TR, Cluster
from tests.unit.policies.random_preemption import fits_without

# --- large requests find their victims ---------------------------------------------------
# (nodes, GPUs a node, GPUs a victim, workers of the request, GPUs a worker)
GANGS = [
    (4, 8, 1, 4, 8),     # 4 x 8 GPUs over 32 one-GPU jobs
    (2, 8, 1, 1, 8),     # one whole node of 8 one-GPU jobs, twice over
    (3, 8, 2, 3, 8),     # 12 two-GPU jobs
    (8, 4, 1, 8, 4),     # 8 x 4 GPUs over 32 one-GPU jobs
    (5, 8, 1, 5, 4),     # half of every node: 20 victims
]


@pytest.mark.parametrize("nodes, gpus, size, workers, per_worker", GANGS)
def test_a_gang_preempts_as_many_jobs_as_it_needs(nodes, gpus, size, workers, per_worker):
    c = Cluster(nodes=nodes, gpus=gpus)
    for n in range(nodes):
        for g in range(0, gpus, size):
            c.running(f"be-{n}-{g}", (f"n{n + 1}", tuple(range(g, g + size))), priority_class=BE)
    c.pending("gang", gpus=per_worker, workers=workers, priority_class=PROD)
    victims = c.victims("gang")
    assert victims is not None
    assert len(victims) == workers * per_worker // size
    (d,) = c.decisions()
    assert sorted(d.victims) == sorted(victims)
    c.preempt(d)
    assert c.placeable("gang")


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_the_search_finds_victims_whenever_a_victim_set_exists(data):
    """Small clusters full of 1- and 2-GPU jobs of mixed classes, a gang of up to 4 x 8 GPUs.
    A victim set exists exactly when stopping *every* eligible job makes room (releasing
    more only frees more), so that is the brute force: whenever it makes room, the
    search returns a set, and that set makes room."""
    d = data.draw
    nodes, gpus = d(st.sampled_from([1, 2, 3, 4, 4, 4])), d(st.sampled_from([4, 8, 8]))
    c = Cluster(nodes=nodes, gpus=gpus)
    k = 0
    for n in range(nodes):
        sizes = d(st.lists(st.sampled_from([1, 1, 1, 2]), min_size=gpus, max_size=gpus))
        mixed = d(st.sampled_from([False, False, True]))     # else: every job is a possible victim
        kinds = d(st.lists(st.sampled_from(["be", "be", "be", "tr", "hi", "keep", "young", "free"] if mixed
                                           else ["be"]), min_size=gpus, max_size=gpus))
        g = 0
        for size, kind in zip(sizes, kinds):
            size = min(size, gpus - g)
            if size <= 0:
                break
            if kind != "free":       # some GPUs stay free
                c.running(f"r{k}", (f"n{n + 1}", tuple(range(g, g + size))),
                          priority_class={"tr": TR, "hi": HI}.get(kind, BE), preemptible=kind != "keep",
                          started=NOW - (10 if kind == "young" else 1000))
                k += 1
            g += size
    c.pending("J", gpus=d(st.sampled_from([1, 2, 4, gpus, gpus, gpus])),
              workers=d(st.sampled_from([1, nodes, nodes, nodes])),
              priority_class=d(st.sampled_from([HI, PROD, PROD])))
    job = c.job("J")
    mine = priority_value(job.spec.priority_class)
    eligible = [j for j in c.state.jobs.values()
                if j.phase is JobPhase.RUNNING and j.spec.preemptible and j.job_id != "J"
                and priority_value(j.spec.priority_class) < mine
                and NOW - j.started_at >= other_rules().min_runtime_s]
    victims = c.victims("J")
    if c.placeable("J"):
        assert victims == ()
        return
    if fits_without(c.state, job, eligible):
        assert victims, f"a set of {len(eligible)} eligible jobs makes room, the search found none"
        assert fits_without(c.state, job, [c.job(v) for v in victims])
    else:
        assert victims is None


# --- a reclaim takes the least that frees enough ------------------------------------------
def reclaim_config():
    from tests.unit.policies.preemption_clusters import quotas
    return quotas(a=4, b=0)     # b borrows everything it holds


# (GPUs the beneficiary needs, the victims expected): n1 holds b's 4-GPU job with the least
# work at risk; n2 holds b's 2-GPU job and two 1-GPU jobs, with more. Among sets that free
# as little, the least work at risk, then the fewest jobs.
@pytest.mark.parametrize("need, expected", [
    (1, ("b1-new",)),       # not the 4-GPU job: it frees 3 GPUs a borrower would take again
    (2, ("b2",)),           # one 2-GPU job rather than 4 GPUs, or two jobs of 1
    (3, ("b1-new", "b2")),  # 3 GPUs exactly
    (4, ("b4",)),
])
def test_a_reclaim_frees_no_more_than_its_beneficiary_needs(need, expected):
    c = Cluster(nodes=2)
    c.running("b4", ("n1", (0, 1, 2, 3)), team="b", ckpt=NOW - 10)
    c.running("b2", ("n2", (0, 1)), team="b", ckpt=NOW - 500)
    c.running("b1-old", ("n2", (2,)), team="b", ckpt=NOW - 600)
    c.running("b1-new", ("n2", (3,)), team="b", ckpt=NOW - 400)
    c.pending("a1", gpus=need, team="a")
    assert sorted(c.victims("a1", reclaim_config())) == sorted(expected)
    (d,) = c.decisions(reclaim_config())
    assert d.reason == "reclaim" and sorted(d.victims) == sorted(expected)
    assert sum(c.job(v).spec.resources.gpus for v in d.victims) == need


def test_priority_preemption_still_prefers_the_least_work_lost():
    """Lower-class victims are still chosen by work at risk first: only capacity of the
    beneficiary's own class is taken by size."""
    c = Cluster(nodes=2)
    c.running("be4", ("n1", (0, 1, 2, 3)), priority_class=BE, ckpt=NOW - 10)
    c.running("be2", ("n2", (0, 1)), priority_class=BE, ckpt=NOW - 500)
    c.running("keep", ("n2", (2, 3)), priority_class=BE, preemptible=False)
    c.pending("hi", gpus=2, priority_class=HI)
    assert c.victims("hi") == ("be4",)


# --- stability: no reclaim below a guarantee, none twice within the window -------------------
def test_a_reclaim_never_takes_a_team_below_its_guarantee():
    from tests.unit.policies.preemption_clusters import quotas
    c = Cluster(nodes=2)
    # b is guaranteed 4 and holds 5: b-old (1 GPU, inside) and b-big (4 GPUs, straddling).
    c.running("b-old", ("n1", (0,)), team="b", started=NOW - 5000)
    c.running("b-big", ("n2", (0, 1, 2, 3)), team="b", started=NOW - 1000)
    c.running("a-old", ("n1", (1, 2, 3)), team="a", started=NOW - 5000)
    c.pending("a1", gpus=1, team="a")
    cfg = quotas(a=4, b=4)
    # Taking b-big would leave b 1 GPU of its 4: b would reclaim back from a next.
    assert c.victims("a1", cfg) is None
    assert c.decisions(cfg) == []


def test_a_reclaim_takes_what_lies_wholly_above_the_guarantee():
    from tests.unit.policies.preemption_clusters import quotas
    c = Cluster(nodes=2)
    c.running("b-old", ("n1", (0,)), team="b", started=NOW - 5000)
    c.running("b-big", ("n2", (0, 1, 2, 3)), team="b", started=NOW - 1000)
    c.running("b-new", ("n1", (1,)), team="b", started=NOW - 500)      # b holds 6: this one is above
    c.running("a-old", ("n1", (2, 3)), team="a", started=NOW - 5000)
    c.pending("a1", gpus=1, team="a")
    cfg = quotas(a=4, b=4)
    assert c.victims("a1", cfg) == ("b-new",)
    (d,) = c.decisions(cfg)
    assert d.reason == "reclaim"


def restart(c: Cluster, job_id: str, node: str, gpus: tuple[int, ...], at: float) -> None:
    """Place a requeued job again (its next attempt) and start it."""
    import gpusched.core.events as ev
    from tests.unit.core.builders import whole
    job = c.job(job_id)
    assert c.log(ev.JobPlaced, job_id=job_id, attempt=job.attempt, time=at,
                 workers=(ev.WorkerAssignment(0, node, whole(*gpus)),)).accepted
    assert c.log(ev.WorkerStarted, job_id=job_id, attempt=job.attempt, worker=0, node=node, time=at).accepted


@pytest.mark.parametrize("window, later, reclaimed_again", [
    (600.0, 300.0, False),     # within the window: kept
    (600.0, 700.0, True),      # past it: borrowed capacity like any other
    (0.0, 300.0, True),        # no window
])
def test_a_reclaimed_job_is_not_reclaimed_again_within_the_window(window, later, reclaimed_again):
    from dataclasses import replace
    from tests.unit.policies.preemption_clusters import quotas
    cfg = replace(quotas(a=4, b=0), reclaim_window_s=window)
    c = Cluster(nodes=1)
    c.running("b1", ("n1", (0, 1, 2, 3)), team="b")
    c.pending("a1", gpus=4, team="a")
    (d,) = c.decisions(cfg)
    assert d.victims == ("b1",) and d.reason == "reclaim"
    c.preempt(d)
    assert c.job("b1").preempted_reason.startswith("reclaim:") and c.job("b1").preempted_at == NOW
    # a1 never came; b1 borrows the node again, and a1 asks once more.
    restart(c, "b1", "n1", (0, 1, 2, 3), at=NOW + 1)
    now = NOW + later
    assert c.victims("a1", cfg, now=now) == (("b1",) if reclaimed_again else None)


def test_a_reclaimed_job_may_still_be_preempted_by_priority_within_the_window():
    from dataclasses import replace
    from tests.unit.policies.preemption_clusters import quotas
    cfg = replace(quotas(a=4, b=0), reclaim_window_s=3600.0)
    c = Cluster(nodes=1)
    c.running("b1", ("n1", (0, 1, 2, 3)), team="b")
    c.pending("a1", gpus=4, team="a")
    (d,) = c.decisions(cfg)
    c.preempt(d)
    restart(c, "b1", "n1", (0, 1, 2, 3), at=NOW + 1)
    c.pending("prod", gpus=4, team="c", priority_class=PROD, at=NOW + 100)
    # Preempted once: its exempt time is 2 x 600 s; past it, within the reclaim window.
    exempt = cfg.exempt_s(c.job("b1"))
    assert exempt == 1200.0
    assert c.victims("prod", cfg, now=NOW + 1 + exempt - 1) is None
    assert c.victims("prod", cfg, now=NOW + 1 + exempt) == ("b1",)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_a_reclaim_leaves_every_team_at_or_above_its_guarantee(data):
    """Two teams of one class on nodes full of their 1-, 2- and 4-GPU jobs, random
    guarantees: whatever a reclaim takes from team b leaves b at or above its guarantee."""
    from tests.unit.policies.preemption_clusters import quotas
    d = data.draw
    nodes = d(st.integers(1, 3))
    c = Cluster(nodes=nodes, gpus=8)
    k = 0
    for n in range(nodes):
        g = 0
        for size in d(st.lists(st.sampled_from([1, 2, 4]), min_size=8, max_size=8)):
            if g + size > 8:
                break
            c.running(f"j{k}", (f"n{n + 1}", tuple(range(g, g + size))), team=d(st.sampled_from(["a", "b", "b"])),
                      started=NOW - d(st.integers(100, 5000)), ckpt=NOW - d(st.integers(0, 90)))
            k += 1
            g += size
    cfg = quotas(a=d(st.integers(0, 16)), b=d(st.integers(0, 16)))
    c.pending("J", gpus=d(st.sampled_from([1, 2, 4])), team="a")
    victims = c.victims("J", cfg)
    if not victims:
        return
    used_b = c.state.usage["b"].gpu_milli
    assert used_b - sum(c.job(v).milli for v in victims) >= cfg.guaranteed_milli("b")
