"""A preemption pays for itself (gpusched.policies.preemption.protection.wait_allowance):
its victims lose, each and together, at most ``max_loss_per_wait`` times the GPU-time its
beneficiary has waited since it last entered the queue, whatever the classes and kinds:
best-effort victims and serving beneficiaries included.

Clusters are built through the reducer (``Cluster`` of ``test_preemption``); the numbers
follow from the rule: a victim that ran 1,000 s on 4 GPUs without a checkpoint loses
4,000 GPU-s, which a 4-GPU job may take at ratio 0.1 once it has waited 10,000 s.
"""
from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpusched.core import events as ev
from gpusched.core.model import JobKind
from gpusched.policies.memory import CycleMemory
from gpusched.policies.preemption.decisions import preemption_decisions, why_no_victims
from gpusched.policies.preemption.protection import Shield, lost_gpu_s, wait_allowance
from gpusched.policies.preemption.victim_rules import PreemptionConfig
from tests.unit.core.builders import whole
from tests.unit.policies.preemption_clusters import BE, HI, NOW, PROD, TR, Cluster, quotas
from tests.unit.policies.random_preemption import SETTINGS, build, random_config

RATIO = PreemptionConfig(max_loss_per_wait=0.1)


def one_victim(*, ckpt: float | None = None, victim_class: str = TR) -> Cluster:
    """n1's 4 GPUs held by ``v`` (running 1,000 s, ``ckpt`` its checkpoint); n2 is absent:
    the pending job fits only in ``v``'s place."""
    c = Cluster(nodes=1)
    c.running("v", ("n1", (0, 1, 2, 3)), priority_class=victim_class, started=NOW - 1000, ckpt=ckpt)
    return c


@pytest.mark.parametrize("waited, preempts", [
    (0.0, False), (9_999.0, False), (10_000.0, True), (50_000.0, True),
])
def test_a_victim_goes_once_the_wait_pays_for_its_lost_work(waited, preempts):
    c = one_victim()
    c.pending("hi", gpus=4, priority_class=HI, at=NOW - waited)
    assert lost_gpu_s(c.job("v"), NOW) == 4000.0
    assert c.victims("hi", RATIO) == (("v",) if preempts else None)


def test_the_allowance_is_the_ratio_times_the_gpu_time_waited():
    c = Cluster()
    c.pending("two", gpus=2, priority_class=HI, at=NOW - 300)
    assert wait_allowance(c.job("two"), NOW, 0.5) == 0.5 * 300 * 2
    assert wait_allowance(c.job("two"), NOW, math.inf) == math.inf


def test_a_checkpointed_victim_goes_at_once():
    c = one_victim(ckpt=NOW - 1)          # 1 s since its checkpoint: 4 GPU-s lost
    c.pending("hi", gpus=4, priority_class=HI, at=NOW - 10)     # allows 0.1 * 10 * 4 = 4
    assert c.victims("hi", RATIO) == ("v",)


def test_best_effort_work_is_charged_like_any_other():
    c = one_victim(victim_class=BE)
    c.pending("tr", gpus=4, priority_class=TR, at=NOW - 100)
    assert c.victims("tr", RATIO) is None
    c.pending("tr-long", gpus=4, priority_class=TR, at=NOW - 10_000)
    assert c.victims("tr-long", RATIO) == ("v",)


def test_a_serving_job_is_bound_too():
    c = one_victim(victim_class=BE)
    c.pending("serve", gpus=4, priority_class=PROD, kind=JobKind.INFERENCE, at=NOW - 100)
    assert c.victims("serve", RATIO) is None
    assert c.victims("serve", PreemptionConfig(max_loss_per_wait=math.inf)) == ("v",)


def test_the_wait_counts_from_the_last_entry_into_the_queue():
    """A job preempted itself waits afresh: its wait before it first ran pays for nothing."""
    c = Cluster(nodes=2)
    c.running("v", ("n1", (0, 1, 2, 3)), started=NOW - 100)          # exempt until NOW + 500
    c.running("old", ("n2", (0, 1, 2, 3)), priority_class=HI, started=NOW - 20_000, ckpt=NOW - 100)
    c.pending("top", gpus=4, priority_class=PROD, at=NOW - 1000)     # allows 400: old loses 400
    (decision,) = c.decisions(RATIO)
    assert decision.victims == ("old",)
    c.preempt(decision)
    assert c.job("old").pending_since == NOW
    assert c.log(ev.JobPlaced, job_id="top", attempt=0, time=NOW,
                 workers=(ev.WorkerAssignment(0, "n2", whole(0, 1, 2, 3)),)).accepted
    later = NOW + 600                      # v lost 700 s x 4 GPUs; old waited 600 s x 4 GPUs
    assert c.victims("old", PreemptionConfig(max_loss_per_wait=math.inf), now=later) == ("v",)
    assert c.victims("old", PreemptionConfig(max_loss_per_wait=1.0), now=later) is None
    assert c.victims("old", PreemptionConfig(max_loss_per_wait=1.2), now=later) == ("v",)


def test_victims_together_lose_no_more_than_the_wait_allows():
    """Two 2-GPU victims each losing 2,000 GPU-s: each alone is within a 3,000 allowance,
    both together are not."""
    c = Cluster(nodes=1)
    c.running("a", ("n1", (0, 1)), started=NOW - 1000)
    c.running("b", ("n1", (2, 3)), started=NOW - 1000)
    c.pending("hi", gpus=4, priority_class=HI, at=NOW - 7_500)       # allows 0.1 * 7,500 * 4 = 3,000
    assert c.victims("hi", RATIO) is None
    c.pending("hi2", gpus=4, priority_class=HI, at=NOW - 10_000)     # allows 4,000
    assert set(c.victims("hi2", RATIO)) == {"a", "b"}


def test_a_victim_ranked_later_is_chosen_when_the_first_costs_too_much():
    """The lowest class goes first, but not when it loses more than the wait allows."""
    c = Cluster(nodes=2)
    c.running("dear", ("n1", (0, 1, 2, 3)), priority_class=TR, started=NOW - 5000)
    c.running("cheap", ("n2", (0, 1, 2, 3)), priority_class=HI, started=NOW - 5000, ckpt=NOW - 100)
    c.pending("top", gpus=4, priority_class=PROD, at=NOW - 1_000)      # allows 400: cheap loses 400
    assert c.victims("top", PreemptionConfig(max_loss_per_wait=math.inf)) == ("dear",)
    assert c.victims("top", RATIO) == ("cheap",)


def test_the_explanation_names_the_cost():
    c = one_victim()
    c.pending("hi", gpus=4, priority_class=HI, at=NOW - 100)
    shields = why_no_victims(c.state, c.job("hi"), NOW, CycleMemory(), RATIO)
    assert shields.shielded == {Shield.COSTLY: 1} and shields.eligible == 0
    assert "costs-more-than-the-wait" in shields.summary()


def test_a_reclaim_pays_for_itself_too():
    """Team b borrows n1 (its guarantee is 0); team a, within its guarantee of 4, waits for
    it in the same class: a reclaim, held to the same allowance."""
    config = PreemptionConfig(quotas=quotas(a=4, b=0).quotas, max_loss_per_wait=0.1)
    c = Cluster(nodes=1)
    c.running("borrowed", ("n1", (0, 1, 2, 3)), team="b", started=NOW - 1000)
    c.pending("mine", gpus=4, team="a", at=NOW - 100)
    assert c.victims("mine", config) is None
    assert why_no_victims(c.state, c.job("mine"), NOW, CycleMemory(), config).shielded == {Shield.COSTLY: 1}
    c.pending("mine-later", gpus=4, team="a", at=NOW - 10_000)
    (decision,) = [d for d in c.decisions(config) if d.for_job == "mine-later"]
    assert decision.victims == ("borrowed",) and decision.reason == "reclaim"


def test_max_loss_per_wait_must_not_be_negative():
    with pytest.raises(ValueError, match="max_loss_per_wait"):
        PreemptionConfig(max_loss_per_wait=-0.1)
    with pytest.raises(ValueError, match="max_loss_per_wait"):
        PreemptionConfig(max_loss_per_wait=math.nan)


@SETTINGS
@given(st.data())
def test_no_decision_loses_more_than_its_beneficiary_waited_for(data):
    """On random clusters, with the job to make room for waiting a random time and a random
    ratio: every victim and every decision's victims together lose at most the allowance
    of the job they are preempted for."""
    log, submitted = build(data)
    now = submitted + data.draw(st.sampled_from([0.0, 60.0, 3_600.0, 86_400.0]))
    config = random_config(data)
    config = PreemptionConfig(**{**{f: getattr(config, f) for f in config.__slots__},
                                 "max_loss_per_wait": data.draw(st.sampled_from([0.0, 0.02, 0.5]))})
    state = log.state
    for d in preemption_decisions(state, now, CycleMemory(), config):
        allowance = wait_allowance(state.jobs[d.for_job], now, config.max_loss_per_wait)
        charged = [lost_gpu_s(state.jobs[v], now) for v in d.victims]
        assert max(charged) <= allowance and sum(charged) <= allowance + 1e-6, (d, charged, allowance)
