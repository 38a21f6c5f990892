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

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpusched.core import events as ev
from gpusched.core.capacity import commit, release
from gpusched.core.digest import digest
from gpusched.core.model import GpuSlot, JobPhase, JobSpec, WorkerResources
from gpusched.core.priority import PRIORITY_CLASSES, priority_value
from gpusched.policies.statement import tentative
from gpusched.policies.placement.gang import place_gang
from gpusched.policies.placement.registry import make_placement
from gpusched.policies.preemption.decisions import Preemption, preemption_decisions, preemption_events, victims_for
from gpusched.policies.queueing.quota import OrgQuota, QueueTree, TeamQuota, claims_guarantee
from gpusched.policies.scheduler import Scheduler
from gpusched.policies.preemption.victim_rules import PreemptionConfig
from tests.unit.core.builders import Log, make_node

TEAMS = ("t1", "t2", "t3")
CLASSES = sorted(PRIORITY_CLASSES)
SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
BEST_FIT = make_placement("best-fit")


def random_spec(data, name: str, classes: list[str] = CLASSES) -> JobSpec:
    d = data.draw
    form = d(st.sampled_from(["whole", "whole", "whole", "share"]))
    gpus = d(st.integers(1, 4)) if form == "whole" else 0
    milli = d(st.sampled_from([250, 500, 750])) if form == "share" else 0
    return JobSpec(
        name=name, team=d(st.sampled_from(TEAMS)), priority_class=d(st.sampled_from(classes)),
        workers=d(st.integers(1, 2)),
        resources=WorkerResources(gpus=gpus, gpu_milli=milli, cpu_milli=d(st.sampled_from([0, 1000, 8000])),
                                  memory_mib=d(st.sampled_from([0, 1000]))),
        preemptible=d(st.integers(0, 3)) > 0,
    )


def build(data) -> tuple[Log, float]:
    d = data.draw
    nodes = [make_node(f"n{i}", gpus=d(st.integers(1, 8)), model=d(st.sampled_from(["H100-80GB", "L40S-48GB"])),
                       cpu=d(st.sampled_from([16_000, 64_000])), mem=64_000)
             for i in range(d(st.integers(1, 4)))]
    log = Log(*nodes)
    t = 1000.0
    for k in range(d(st.integers(2, 16))):
        log(ev.JobSubmitted, job_id=f"r{k}", spec=random_spec(data, f"r{k}"), time=t)
    for round_ in range(2):
        t += d(st.sampled_from([0.0, 20.0, 200.0]))
        for dec in Scheduler().cycle(log.state, t):
            assert log(ev.JobPlaced, job_id=dec.job_id, attempt=dec.attempt, workers=dec.workers, time=t).accepted
            if d(st.integers(0, 4)) > 0:          # most start; some stay PLACED
                for w in dec.workers:
                    assert log(ev.WorkerStarted, job_id=dec.job_id, attempt=dec.attempt, worker=w.worker,
                               node=w.node, time=t).accepted
    now = t + d(st.sampled_from([5.0, 40.0, 500.0]))
    for job in list(log.state.jobs.values()):
        if job.phase is JobPhase.RUNNING and d(st.booleans()):
            assert log(ev.CheckpointSaved, job_id=job.job_id, attempt=job.attempt, checkpoint="c",
                       time=d(st.sampled_from([job.started_at, now - 1.0]))).accepted
    # The job to make room for: usually of a high class, so that victims exist.
    high = ["production-inference", "training-high", "training-high", "training"]
    log(ev.JobSubmitted, job_id="J", spec=random_spec(data, "J", d(st.sampled_from([CLASSES, high, high]))),
        time=now)
    return log, now


def random_config(data) -> PreemptionConfig:
    d = data.draw
    teams = {t: TeamQuota(guaranteed_gpus=d(st.sampled_from([0, 0, 1, 4, 8, 16]))) for t in TEAMS}
    # No bound on the work lost for a wait (test_preemption_cost): these are the other rules.
    return PreemptionConfig(min_runtime_s=d(st.sampled_from([0.0, 30.0, 30.0, 300.0])), max_victims=64,
                            quotas=QueueTree(orgs={"o": OrgQuota(teams=teams)}), max_loss_per_wait=math.inf)


def fits(state, job) -> bool:
    with tentative(state) as statement:
        return place_gang(state, job, BEST_FIT, statement) is not None


def fits_without(state, job, victims) -> bool:
    """Whether ``job`` fits once ``victims`` are gone (released tentatively here)."""
    for v in victims:
        release(state, v, v.workers)
    try:
        return fits(state, job)
    finally:
        for v in reversed(victims):
            commit(state, v, v.workers)


@SETTINGS
@given(st.data())
def test_victims_make_the_job_placeable(data):
    log, now = build(data)
    config = random_config(data)
    state = log.state
    job = state.jobs["J"]
    before = digest(state)
    victims = victims_for(state, job, now, config)
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
        placed = {d.job_id for d in Scheduler().cycle(state, now)}
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
    decisions = preemption_decisions(state, now, config)
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
    # (docs/scheduling-fairness.md).
    placed = {d.job_id: d.workers for d in Scheduler().cycle(state, now)}
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
    decisions = preemption_decisions(log.state, now, PreemptionConfig(min_runtime_s=0.0, max_loss_per_wait=math.inf))
    assert [(d.for_job, d.victims, d.planned_nodes) for d in decisions] == [
        ("pair", ("small",), ("n0", "n1")), ("big", ("triple",), ("n0",))]
    for d in decisions:
        for e in preemption_events(log.state, d, now):
            assert log.replay(e).accepted
        for v in d.victims:
            log.stopped(v)
    assert {j: nodes for j, (nodes, _) in log.state.nominations.items()} == {"pair": ("n0", "n1"), "big": ("n0",)}
    placed = {d.job_id: d.workers for d in Scheduler().cycle(log.state, log.now)}
    assert sorted(w.node for w in placed["pair"]) == ["n0", "n1"]
    assert [w.node for w in placed["big"]] == ["n0"]
