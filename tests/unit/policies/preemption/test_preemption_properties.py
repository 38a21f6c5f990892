"""Property tests for victim selection on random clusters and workloads.

Whenever ``victims_for`` returns a set: every victim is eligible; preempting exactly those
through the reducer (JobPreempted, then WorkerFinished for each of their workers) makes
the job placeable by the placer's own ``place_gang`` (and by a scheduler cycle when
nothing pending outranks it); the set is minimal (each victim is needed); a reclaim leaves
every team it takes from at or above its guarantee. When it returns
None, even stopping every job of a lower priority class that may be preempted does not
make room. The policy never changes the state. When one preemptor pass decides for
several jobs, the next scheduler cycle places all of them (nominees first, each bound to
the nodes the preemptor planned it on): placing them one by one anywhere the policy likes
need not, as one may take what was freed for another.
"""
from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from gpusched.core import events as ev
from gpusched.core.digest import digest
from gpusched.core.model import GpuSlot, JobPhase
from gpusched.core.priority import priority_value
from gpusched.policies.memory import CycleMemory
from gpusched.policies.preemption.decisions import Preemption, preemption_decisions, preemption_events, victims_for
from gpusched.policies.queueing.quota import claims_guarantee
from gpusched.policies.scheduler import Scheduler
from gpusched.policies.preemption.victim_rules import PreemptionConfig
from tests.unit.core.builders import Log, make_node
from tests.unit.policies.random_preemption import (
    SETTINGS, random_spec, build, random_config, fits, fits_without,
)


@SETTINGS
@given(st.data())
def test_victims_make_the_job_placeable(data):
    log, now = build(data)
    config = random_config(data)
    state = log.state
    job = state.jobs["J"]
    before = digest(state)
    victims = victims_for(state, job, now, CycleMemory(), config)
    assert digest(state) == before

    mine = priority_value(job.spec.priority_class)
    if victims is None:
        assert not fits(state, job)
        lower = [j for j in state.jobs.values()
                 if j.phase in (JobPhase.RUNNING, JobPhase.PLACED) and j.spec.preemptible
                 and priority_value(j.spec.priority_class) < mine
                 and now - (j.started_at or j.placed_at) >= config.min_runtime_s]
        assert not fits_without(state, job, lower)
        return
    if victims == ():
        assert fits(state, job)
        return
    assert not fits(state, job)
    assert len(set(victims)) == len(victims)
    jobs = [state.jobs[v] for v in victims]
    for v in jobs:
        assert v.phase in (JobPhase.RUNNING, JobPhase.PLACED) and v.spec.preemptible
        age = now - (v.started_at or v.placed_at)
        theirs = priority_value(v.spec.priority_class)
        # Priority waits the exempt time (no job here was preempted before: min_runtime_s);
        # a reclaim, of borrowed capacity, reclaim_min_runtime_s.
        if theirs >= mine or age < config.min_runtime_s:
            assert age >= config.reclaim_min_runtime_s
            assert v.team != job.team and state.usage[v.team].gpu_milli > config.guaranteed_milli(v.team)
        if theirs >= mine:          # only quota reclaim, from a borrowing team, same class
            assert theirs == mine and v.team != job.team
            used = state.usage[job.team].gpu_milli if job.team in state.usage else 0
            # the job is claimed against its team's guarantee (within it, or crossing it from below)
            assert claims_guarantee(used, job.milli, config.guaranteed_milli(job.team))
            assert state.usage[v.team].gpu_milli > config.guaranteed_milli(v.team)
    # A reclaim never takes a team below its guarantee.
    for team in {v.team for v in jobs if priority_value(v.spec.priority_class) >= mine}:
        left = state.usage[team].gpu_milli - sum(v.milli for v in jobs if v.team == team)
        assert left >= config.guaranteed_milli(team)
    # Minimal: every victim is needed.
    for i in range(len(jobs)):
        assert not fits_without(state, job, jobs[:i] + jobs[i + 1:])

    # Carry it out through the reducer.
    decision = Preemption("J", victims, "priority")
    for e in preemption_events(state, decision, now):
        assert log.replay(e).accepted
    for v in jobs:
        for w in v.workers:
            assert log(ev.WorkerFinished, job_id=v.job_id, attempt=v.attempt, worker=w.worker, node=w.node,
                       exit_code=0, time=now).accepted
        assert v.phase is JobPhase.PENDING
    assert fits(state, job)
    others = [j for j in state.pending if j != "J"]
    if all(priority_value(state.jobs[j].spec.priority_class) < mine for j in others):
        placed = {d.job_id for d in Scheduler().cycle(state, now, CycleMemory())}
        assert "J" in placed


@SETTINGS
@given(st.data())
def test_decisions_are_disjoint_and_leave_the_state_alone(data):
    log, now = build(data)
    for k in range(data.draw(st.integers(0, 3))):
        log(ev.JobSubmitted, job_id=f"p{k}", spec=random_spec(data, f"p{k}"), time=now)
    config = random_config(data)
    state = log.state
    before = digest(state)
    decisions = preemption_decisions(state, now, CycleMemory(), config)
    assert digest(state) == before
    seen: set[str] = set()
    for d in decisions:
        assert d.victims and not seen & set(d.victims)
        seen |= set(d.victims)
        assert state.jobs[d.for_job].phase is JobPhase.PENDING
        assert d.reason in ("priority", "reclaim")
    # Carry them all out: every beneficiary then fits, all of them together.
    for d in decisions:
        for e in preemption_events(state, d, now):
            assert log.replay(e).accepted
        for v in d.victims:
            victim = state.jobs[v]
            for w in victim.workers:
                assert log(ev.WorkerFinished, job_id=v, attempt=victim.attempt, worker=w.worker, node=w.node,
                           exit_code=0, time=now).accepted
    # The next cycle places every beneficiary, each on the nodes the preemptor planned it
    # on (its nomination), nominees being offered in the order they were nominated
    # (docs/design/scheduling-fairness.md).
    placed = {d.job_id: d.workers for d in Scheduler().cycle(state, now, CycleMemory())}
    for d in decisions:
        assert d.for_job in placed
        assert {w.node for w in placed[d.for_job]} <= set(d.planned_nodes)


def test_beneficiaries_sharing_a_node_are_both_placed():
    """Found by the property above: n0 has 5 GPUs, one free; the preemptor frees a 1-GPU
    job there for "pair" (2 x 2 GPUs), planned on n0 and on n1's free GPUs, then a 3-GPU
    job on n0 for "big". Were "pair" nominated the victims' node only (n0), the cycle would
    bind it to n0 whole, and "big" would not fit; nominated where it was planned, each
    beneficiary is placed."""
    log = Log(make_node("n0", gpus=5), make_node("n1", gpus=3))
    for job_id, node, gpus, first in [("small", "n0", 1, 0), ("triple", "n0", 3, 1), ("fill", "n1", 1, 0)]:
        log.submit(job_id, gpus=gpus, priority_class="best-effort")
        log.run(job_id, (node, tuple(GpuSlot(i, 1000) for i in range(first, first + gpus))))
    log.submit("pair", gpus=2, workers=2, priority_class="production-inference")
    log.submit("big", gpus=3, priority_class="production-inference")
    now = log.now + 1.0
    decisions = preemption_decisions(log.state, now, CycleMemory(), PreemptionConfig(min_runtime_s=0.0, max_loss_per_wait=math.inf))
    assert [(d.for_job, d.victims, d.planned_nodes) for d in decisions] == [
        ("pair", ("small",), ("n0", "n1")), ("big", ("triple",), ("n0",))]
    for d in decisions:
        for e in preemption_events(log.state, d, now):
            assert log.replay(e).accepted
        for v in d.victims:
            log.stopped(v)
    assert {j: nodes for j, (nodes, _) in log.state.nominations.items()} == {"pair": ("n0", "n1"), "big": ("n0",)}
    placed = {d.job_id: d.workers for d in Scheduler().cycle(log.state, log.now, CycleMemory())}
    assert sorted(w.node for w in placed["pair"]) == ["n0", "n1"]
    assert [w.node for w in placed["big"]] == ["n0"]
