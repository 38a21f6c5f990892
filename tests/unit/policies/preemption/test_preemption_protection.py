"""Work-loss-aware preemption (gpusched.policies.preemption.protection): exempt times that
grow with each preemption and are bounded, the preemption budget (priority only; reclaim
may still take a job past it), victims ranked by GPU-seconds lost, and the typed reasons
(``Shield``) the preemptor gives for jobs that are not victims.

Clusters are built through the reducer (``Cluster`` of ``test_preemption``); a job's
earlier preemptions are real ones (JobPreempted, its workers finished, placed again).
"""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpusched.core import events as ev
from gpusched.core.model import JobPhase
from gpusched.core.priority import priority_value
from gpusched.policies.memory import CycleMemory
from gpusched.policies.preemption.decisions import why_no_victims
from gpusched.policies.preemption.protection import Shield, exempt_s, lost_gpu_s, running_since
from gpusched.policies.preemption.victim_rules import PreemptionConfig
from gpusched.policies.queueing.quota import OrgQuota, QueueTree, TeamQuota
from tests.unit.policies.preemption_configs import other_rules
from tests.unit.core.builders import whole
from tests.unit.policies.preemption_clusters import BE, HI, NOW, TR, Cluster
from tests.unit.policies.random_preemption import fits_without

PROPERTY = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def running_after(c: Cluster, job_id: str, placement: tuple, *, preempted: int, started: float,
                  ckpt: float | None = None, **spec_kw) -> None:
    """``job_id`` on ``placement`` (node, GPU indexes), running since ``started`` after being
    preempted ``preempted`` times (each attempt placed, started and preempted through the
    reducer before ``started``)."""
    node, gpus = placement
    spec_kw.setdefault("gpus", len(gpus))
    c.pending(job_id, at=started - 100 * (preempted + 1), **spec_kw)
    for attempt in range(preempted + 1):
        at = started - 100 * (preempted - attempt)
        workers = (ev.WorkerAssignment(0, node, whole(*gpus)),)
        assert c.log(ev.JobPlaced, job_id=job_id, attempt=attempt, workers=workers, time=at).accepted
        assert c.log(ev.WorkerStarted, job_id=job_id, attempt=attempt, worker=0, node=node, time=at).accepted
        if attempt < preempted:
            assert c.log(ev.JobPreempted, job_id=job_id, attempt=attempt, for_job="someone",
                         reason="priority: preempted for someone", time=at + 50).accepted
            assert c.log(ev.WorkerFinished, job_id=job_id, attempt=attempt, worker=0, node=node, exit_code=0,
                         time=at + 50).accepted
    if ckpt is not None:
        assert c.log(ev.CheckpointSaved, job_id=job_id, attempt=preempted, checkpoint="c", time=ckpt).accepted
    assert c.job(job_id).preemptions == preempted and c.job(job_id).phase is JobPhase.RUNNING


def quotas(config: PreemptionConfig = other_rules(), **guaranteed: float) -> PreemptionConfig:
    tree = QueueTree(orgs={"org": OrgQuota(teams={t: TeamQuota(guaranteed_gpus=g) for t, g in guaranteed.items()})})
    return PreemptionConfig(**{**{f: getattr(config, f) for f in config.__slots__}, "quotas": tree})


# --- the exempt time ------------------------------------------------------------------------
@pytest.mark.parametrize("preemptions, base, growth, cap, expected", [
    (0, 600.0, 2.0, 3600.0, 600.0),
    (1, 600.0, 2.0, 3600.0, 1200.0),
    (2, 600.0, 2.0, 3600.0, 2400.0),
    (3, 600.0, 2.0, 3600.0, 3600.0),      # 4,800 capped
    (1_000, 600.0, 2.0, 3600.0, 3600.0),  # no overflow, still capped
    (5, 600.0, 1.0, 3600.0, 600.0),       # no growth
    (2, 600.0, 3.0, 1e9, 5400.0),
    (4, 7200.0, 2.0, 3600.0, 7200.0),     # a cap below the base: the base
    (3, 0.0, 2.0, 3600.0, 0.0),
])
def test_exempt_time_grows_per_preemption_and_is_bounded(preemptions, base, growth, cap, expected):
    assert exempt_s(preemptions, base, growth, cap) == expected


DEFAULTS = other_rules()


@pytest.mark.parametrize("preempted, age, config, is_victim", [
    (0, 599.0, DEFAULTS, False),          # defaults: 10 min ...
    (0, 600.0, DEFAULTS, True),
    (1, 1199.0, DEFAULTS, False),         # ... 20 min after one preemption ...
    (1, 1200.0, DEFAULTS, True),
    (2, 2399.0, DEFAULTS, False),         # ... 40 min after two
    (2, 2400.0, DEFAULTS, True),
    (3, 1e6, DEFAULTS, False),            # budget of 3 spent: never for priority
    (3, 3599.0, other_rules(preemption_budget=0), False),   # no budget: capped at an hour
    (3, 3600.0, other_rules(preemption_budget=0), True),
    (9, 3600.0, other_rules(preemption_budget=0), True),
    (3, 3600.0, other_rules(preemption_budget=4), True),
    (4, 1e6, other_rules(preemption_budget=4), False),
    (0, 60.0, other_rules(pool_min_runtime_s={"default": 60.0}), True),    # the pool's own
    (0, 60.0, other_rules(pool_min_runtime_s={"other": 60.0}), False),
    (1, 120.0, other_rules(pool_min_runtime_s={"default": 60.0}), True),   # grows from the pool's
    (1, 119.0, other_rules(pool_min_runtime_s={"default": 60.0}), False),
    (0, 30.0, other_rules(min_runtime_s=30.0), True),
])
def test_exempt_time_and_budget_decide_who_is_a_victim(preempted, age, config, is_victim):
    c = Cluster(nodes=1)
    running_after(c, "x", ("n1", (0, 1, 2, 3)), preempted=preempted, started=NOW - age, priority_class=BE)
    c.pending("hi", gpus=4, priority_class=HI)
    assert c.victims("hi", config) == (("x",) if is_victim else None)


def test_a_spent_budget_still_yields_to_a_reclaim_of_the_guarantee():
    """Team a is owed 4 GPUs and holds none; team b borrows the node with a best-effort job
    past its budget: not a victim for priority, a victim for reclaim, and the decision says
    reclaim (so the reclaim window then protects it)."""
    c = Cluster(nodes=1)
    running_after(c, "b-be", ("n1", (0, 1, 2, 3)), preempted=3, started=NOW - 1e5, team="b", priority_class=BE)
    c.pending("a-tr", gpus=4, team="a", priority_class=TR)
    assert c.victims("a-tr") is None
    assert c.victims("a-tr", quotas(a=0, b=0)) is None           # a is owed nothing: no reclaim
    config = quotas(a=4, b=0)
    assert c.victims("a-tr", config) == ("b-be",)
    (decision,) = c.decisions(config)
    assert decision.reason == "reclaim"
    # Within b's guarantee it stays.
    assert c.victims("a-tr", quotas(a=4, b=4)) is None


def test_a_reclaim_waits_its_own_min_runtime_not_the_exempt_time():
    """A borrower's job preempted twice (exempt time 40 min) is reclaimed once it ran
    ``reclaim_min_runtime_s`` (30 s): the guarantee is owed now."""
    c = Cluster(nodes=1)
    running_after(c, "b1", ("n1", (0, 1, 2, 3)), preempted=2, started=NOW - 29, team="b", gpus=4)
    c.pending("a1", gpus=4, team="a")
    config = quotas(a=4, b=0)
    assert c.victims("a1", config) is None
    assert why_no_victims(c.state, c.job("a1"), NOW, CycleMemory(), config).next_eligible_at == NOW + 1
    assert c.victims("a1", config, now=NOW + 1) == ("b1",)
    assert c.victims("a1", quotas(other_rules(reclaim_min_runtime_s=300.0), a=4, b=0), now=NOW + 1) is None


# --- ranking by work lost -------------------------------------------------------------------
def test_victims_lose_the_fewest_gpu_seconds_not_the_fewest_seconds():
    """``wide`` lost 400 s on 4 GPUs (1,600 GPU-s), ``narrow`` 1,000 s on 1 GPU (1,000 GPU-s):
    a 1-GPU job takes ``narrow``, though it ran longer since its checkpoint."""
    c = Cluster(nodes=2, gpus=4)
    c.running("wide", ("n1", (0, 1, 2, 3)), priority_class=BE, started=NOW - 5000, ckpt=NOW - 400)
    c.running("narrow", ("n2", (0,)), priority_class=BE, started=NOW - 1000)
    c.running("pinned", ("n2", (1, 2, 3)), priority_class=BE, preemptible=False)
    c.pending("hi", gpus=1, priority_class=HI)
    assert c.victims("hi") == ("narrow",)
    assert lost_gpu_s(c.job("wide"), NOW) == 1600.0 and lost_gpu_s(c.job("narrow"), NOW) == 1000.0


def test_a_recent_checkpoint_makes_the_cheaper_victim():
    c = Cluster(nodes=2, gpus=4)
    c.running("old-ckpt", ("n1", (0, 1, 2, 3)), priority_class=BE, started=NOW - 3000, ckpt=NOW - 2000)
    c.running("new-ckpt", ("n2", (0, 1, 2, 3)), priority_class=BE, started=NOW - 3000, ckpt=NOW - 700)
    c.pending("hi", gpus=4, priority_class=HI)
    assert c.victims("hi") == ("new-ckpt",)


# --- typed reasons ------------------------------------------------------------------------------
def test_why_no_victims_names_the_rule_for_each_job():
    c = Cluster(nodes=3, gpus=4)
    c.running("young", ("n1", (0,)), priority_class=BE, started=NOW - 100)
    c.running("pinned", ("n1", (1,)), priority_class=BE, preemptible=False)
    c.running("higher", ("n1", (2,)), priority_class=HI)
    running_after(c, "spent", ("n1", (3,)), preempted=3, started=NOW - 1e5, priority_class=BE)
    c.running("same", ("n2", (0, 1, 2, 3)), priority_class=TR, team="b")
    c.running("old", ("n3", (0, 1, 2, 3)), priority_class=BE)
    c.pending("tr", gpus=8, priority_class=TR)
    why = why_no_victims(c.state, c.job("tr"), NOW, CycleMemory(), other_rules())
    assert why.shielded == {Shield.EXEMPT: 1, Shield.NOT_PREEMPTIBLE: 1, Shield.NOT_LOWER: 2,
                            Shield.BUDGET_SPENT: 1}
    assert why.eligible == 1
    assert why.next_eligible_at == NOW - 100 + 600
    assert "1 exempt" in why.summary() and "next exempt time ends at" in why.summary()


def test_why_no_victims_for_a_reclaim():
    c = Cluster(nodes=2, gpus=4)
    c.running("b-inside", ("n1", (0, 1, 2, 3)), team="b", priority_class=TR)
    c.running("b-above", ("n2", (0, 1, 2, 3)), team="b", priority_class=TR, started=NOW - 900)
    c.pending("a1", gpus=4, team="a", priority_class=TR)
    why = why_no_victims(c.state, c.job("a1"), NOW, CycleMemory(), quotas(a=4, b=4))
    assert why.shielded == {Shield.GUARANTEED: 1} and why.eligible == 1
    # b-above reclaimed a minute ago, placed again at once: inside the reclaim window.
    assert c.log(ev.JobPreempted, job_id="b-above", attempt=0, for_job="x", reason="reclaim: preempted for x",
                 time=NOW - 60).accepted
    assert c.log(ev.WorkerFinished, job_id="b-above", attempt=0, worker=0, node="n2", exit_code=0,
                 time=NOW - 60).accepted
    assert c.log(ev.JobPlaced, job_id="b-above", attempt=1, time=NOW - 60,
                 workers=(ev.WorkerAssignment(0, "n2", whole(0, 1, 2, 3)),)).accepted
    assert c.log(ev.WorkerStarted, job_id="b-above", attempt=1, worker=0, node="n2", time=NOW - 60).accepted
    config = quotas(other_rules(min_runtime_s=0.0), a=4, b=4)
    assert why_no_victims(c.state, c.job("a1"), NOW, CycleMemory(), config).shielded == {
        Shield.GUARANTEED: 1, Shield.RECLAIM_WINDOW: 1}


# --- properties on random clusters ------------------------------------------------------------
def random_cluster(data) -> tuple[Cluster, PreemptionConfig]:
    """Nodes of 4 GPUs full of 1- and 2-GPU jobs of random classes, ages, checkpoints and
    earlier preemptions; a pending job of a high class; random rules."""
    d = data.draw
    nodes = d(st.integers(1, 4))
    c = Cluster(nodes=nodes, gpus=4)
    k = 0
    for n in range(nodes):
        gpu = 0
        while gpu < 4:
            size = min(d(st.sampled_from([1, 1, 2])), 4 - gpu)
            started = NOW - d(st.sampled_from([10.0, 300.0, 700.0, 1500.0, 3000.0, 5000.0]))
            ckpt = d(st.sampled_from([None, None, started + 5.0, NOW - 50.0]))
            running_after(c, f"r{k}", (f"n{n + 1}", tuple(range(gpu, gpu + size))),
                          preempted=d(st.integers(0, 4)), started=started, ckpt=ckpt,
                          priority_class=d(st.sampled_from([BE, BE, TR])), team=d(st.sampled_from(["a", "b"])))
            gpu, k = gpu + size, k + 1
    c.pending("J", gpus=d(st.sampled_from([1, 2, 4])), workers=d(st.sampled_from([1, 1, 2])), priority_class=HI,
              team=d(st.sampled_from(["a", "b"])))
    config = other_rules(min_runtime_s=d(st.sampled_from([0.0, 300.0, 600.0])),
                              min_runtime_growth=d(st.sampled_from([1.0, 2.0, 3.0])),
                              max_min_runtime_s=d(st.sampled_from([600.0, 3600.0])),
                              preemption_budget=d(st.sampled_from([0, 1, 2, 3])))
    return c, config


@PROPERTY
@given(st.data())
def test_no_victim_is_younger_than_its_exempt_time_nor_past_its_budget(data):
    c, config = random_cluster(data)
    decisions = c.decisions(config)
    for d in decisions:
        assert d.reason == "priority"         # no quotas: every preemption is for priority
        for vid in d.victims:
            victim = c.job(vid)
            assert NOW - running_since(victim) >= config.exempt_s(victim)
            assert config.exempt_s(victim) <= max(config.min_runtime_s, config.max_min_runtime_s)
            assert config.preemption_budget == 0 or victim.preemptions < config.preemption_budget
    # None found: even every job the rules allow does not make room.
    if not decisions:
        job = c.job("J")
        allowed = [j for j in c.state.jobs.values() if j.phase is JobPhase.RUNNING and j.spec.preemptible
                   and priority_value(j.spec.priority_class) < priority_value(HI)
                   and NOW - running_since(j) >= config.exempt_s(j)
                   and (config.preemption_budget == 0 or j.preemptions < config.preemption_budget)]
        assert not fits_without(c.state, job, allowed)


@PROPERTY
@given(st.data())
def test_victims_on_a_node_are_those_that_lose_least(data):
    """One node of 8 GPUs full of 1-GPU best-effort jobs with random work since their last
    checkpoint; a job of k GPUs takes the k that lose the fewest GPU-seconds."""
    d = data.draw
    c = Cluster(nodes=1, gpus=8)
    for g in range(8):
        started = NOW - d(st.integers(600, 20_000))
        ckpt = d(st.one_of(st.none(), st.floats(started, NOW)))
        c.running(f"r{g}", ("n1", (g,)), priority_class=BE, started=started, ckpt=ckpt)
    k = d(st.integers(1, 8))
    c.pending("J", gpus=k, priority_class=HI)
    victims = c.victims("J")
    losses = sorted(lost_gpu_s(c.job(f"r{g}"), NOW) for g in range(8))
    assert victims is not None and len(victims) == k
    assert sum(lost_gpu_s(c.job(v), NOW) for v in victims) == pytest.approx(sum(losses[:k]))


# --- a gang is delayed by exempt times, not starved -------------------------------------------
@pytest.mark.parametrize("preempted", [0, 2, 5, 50])
def test_a_gang_waits_at_most_the_bounded_exempt_time(preempted):
    """4 nodes full of 32 one-GPU best-effort jobs, each preempted ``preempted`` times and
    restarted at NOW (no budget: only exempt times hold them). The 4 x 8-GPU gang finds its
    32 victims once their exempt time ends, never later than ``max_min_runtime_s``."""
    config = other_rules(preemption_budget=0)
    c = Cluster(nodes=4, gpus=8)
    for n in range(4):
        for g in range(8):
            running_after(c, f"be-{n}-{g}", (f"n{n + 1}", (g,)), preempted=preempted, started=NOW,
                          priority_class=BE)
    c.pending("gang", gpus=8, workers=4, priority_class="production-inference", at=NOW)
    wait = config.exempt_s(c.job("be-0-0"))
    assert wait == min(600.0 * 2 ** preempted, 3600.0) <= config.max_min_runtime_s
    assert c.victims("gang", config, now=NOW + wait - 1) is None
    assert len(c.victims("gang", config, now=NOW + wait)) == 32


# --- the preemptor's flags ----------------------------------------------------------------------
def _settings(argv: list[str]):
    import argparse

    from gpusched.config import PreemptorSettings
    parser = argparse.ArgumentParser()
    PreemptorSettings.add_args(parser, {})
    return PreemptorSettings.from_args(parser.parse_args(argv), {})


def test_the_flags_default_to_the_policys_defaults_and_reach_it():
    from gpusched_preemptor.main import preemption_config
    default = preemption_config(_settings([]))
    fields = ("min_runtime_s", "min_runtime_growth", "max_min_runtime_s", "pool_min_runtime_s",
              "preemption_budget", "reclaim_min_runtime_s", "reclaim_window_s")
    assert {f: getattr(default, f) for f in fields} == {f: getattr(PreemptionConfig(), f) for f in fields}
    config = preemption_config(_settings([
        "--min-runtime", "300", "--min-runtime-growth", "3", "--max-min-runtime", "7200",
        "--pool-min-runtime", "a100=60", "--pool-min-runtime", "l40s=900", "--preemption-budget", "0",
        "--reclaim-min-runtime", "5"]))
    assert (config.min_runtime_s, config.min_runtime_growth, config.max_min_runtime_s, config.preemption_budget,
            config.reclaim_min_runtime_s) == (300.0, 3.0, 7200.0, 0, 5.0)
    assert config.pool_min_runtime_s == {"a100": 60.0, "l40s": 900.0}


@pytest.mark.parametrize("argv, named", [
    (["--pool-min-runtime", "a100"], "--pool-min-runtime"),
    (["--pool-min-runtime", "a100=-1"], "--pool-min-runtime"),
    (["--pool-min-runtime", "a100=inf"], "--pool-min-runtime"),
    (["--min-runtime-growth", "0.5"], "--min-runtime-growth"),
    (["--preemption-budget", "-1"], "--preemption-budget"),
    (["--reclaim-min-runtime", "-3"], "--reclaim-min-runtime"),
])
def test_bad_flags_name_the_flag(argv, named):
    from gpusched.config import SettingsError
    with pytest.raises(SettingsError, match=named):
        _settings(argv)
