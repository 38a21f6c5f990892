"""The preemptor's placer views are built once per call and follow the call's tentative
changes (``SearchContext.tentative``): its decisions must be exactly those of views built
afresh for every job (``preemption_oracle``), on random clusters, for every placement
policy, and the state is left as it was. Defragmentation's own kept view (free whole GPUs)
must agree with a scan of the pool.
"""
from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from gpusched.core import events as ev
from gpusched.core.digest import digest
from gpusched.core.model import JobPhase
from gpusched.policies.placement.registry import PLACEMENTS
from gpusched.policies.preemption.decisions import preemption_decisions
from gpusched.policies.preemption.defrag import _blocked, blocked_by_fragmentation, defrag_decisions
from gpusched.policies.preemption.victim_rules import PreemptionConfig, SearchContext
from gpusched.policies.scheduler import Scheduler
from tests.unit.core.builders import Log, make_node, make_spec, whole
from tests.unit.policies import preemption_oracle as oracle
from tests.unit.policies.test_preemption_properties import CLASSES, SETTINGS, random_config, random_spec

HIGH = ["production-inference", "training-high", "training-high", "training"]


def busy_cluster(data) -> tuple[Log, float]:
    """Nodes partly filled by a scheduler's cycles (some jobs checkpointable, some
    checkpointed), then several pending jobs, mostly of high classes."""
    d = data.draw
    nodes = [make_node(f"n{i}", gpus=d(st.integers(1, 8)), model=d(st.sampled_from(["H100-80GB", "L40S-48GB"])),
                       cpu=d(st.sampled_from([16_000, 64_000])), mem=64_000)
             for i in range(d(st.integers(1, 8)))]
    log = Log(*nodes)
    t = 1000.0
    for k in range(d(st.integers(2, 24))):
        spec = replace(random_spec(data, f"r{k}"), checkpoint_interval_s=d(st.sampled_from([0.0, 300.0])))
        log(ev.JobSubmitted, job_id=f"r{k}", spec=spec, time=t)
    for _ in range(2):
        t += d(st.sampled_from([0.0, 20.0, 200.0]))
        for dec in Scheduler().cycle(log.state, t):
            assert log(ev.JobPlaced, job_id=dec.job_id, attempt=dec.attempt, workers=dec.workers, time=t).accepted
            if d(st.integers(0, 4)) > 0:
                for w in dec.workers:
                    assert log(ev.WorkerStarted, job_id=dec.job_id, attempt=dec.attempt, worker=w.worker,
                               node=w.node, time=t).accepted
    now = t + d(st.sampled_from([5.0, 40.0, 500.0, 2000.0]))
    for job in list(log.state.jobs.values()):
        if job.phase is JobPhase.RUNNING and d(st.booleans()):
            assert log(ev.CheckpointSaved, job_id=job.job_id, attempt=job.attempt, checkpoint="c",
                       time=d(st.sampled_from([job.started_at, now - 1.0]))).accepted
    for k in range(d(st.integers(1, 8))):
        classes = d(st.sampled_from([CLASSES, HIGH, HIGH]))
        log(ev.JobSubmitted, job_id=f"p{k}", spec=random_spec(data, f"p{k}", classes), time=now)
    return log, now


def fragmented_cluster(data) -> tuple[Log, float]:
    """Nodes with running 1- and 2-GPU jobs on scattered GPUs (checkpointable, mostly
    checkpointed lately, past their exempt time), then several pending whole-GPU jobs:
    room spread over nodes, which defragmentation consolidates."""
    d = data.draw
    now = 10_000.0
    log = Log(*(make_node(f"n{i}", gpus=d(st.sampled_from([4, 8]))) for i in range(d(st.integers(2, 6)))))
    k = 0
    for node in list(log.state.nodes.values()):
        gpu = 0
        while gpu < len(node.gpus):
            size = d(st.sampled_from([0, 1, 1, 2]))
            if size and gpu + size <= len(node.gpus):
                k += 1
                spec = replace(make_spec(name=f"r{k}", team=d(st.sampled_from(["t1", "t2"])), gpus=size, cpu=0,
                                         mem=0, priority_class=d(st.sampled_from(["best-effort", "training"]))),
                               checkpoint_interval_s=d(st.sampled_from([0.0, 300.0, 300.0])))
                started = now - d(st.sampled_from([100.0, 1000.0, 1000.0]))
                assert log(ev.JobSubmitted, job_id=f"r{k}", spec=spec, time=started - 1).accepted
                assert log(ev.JobPlaced, job_id=f"r{k}", attempt=0, time=started, workers=(
                    ev.WorkerAssignment(0, node.name, whole(*range(gpu, gpu + size))),)).accepted
                assert log(ev.WorkerStarted, job_id=f"r{k}", attempt=0, worker=0, node=node.name,
                           time=started).accepted
                if d(st.integers(0, 3)):
                    assert log(ev.CheckpointSaved, job_id=f"r{k}", attempt=0, checkpoint="c",
                               time=now - d(st.sampled_from([60.0, 900.0]))).accepted
            gpu += max(size, 1)
    for p in range(d(st.integers(1, 6))):
        spec = make_spec(name=f"p{p}", team=d(st.sampled_from(["t1", "t2"])), gpus=d(st.sampled_from([2, 4, 8])),
                         workers=d(st.sampled_from([1, 1, 2])), cpu=0, mem=0,
                         priority_class=d(st.sampled_from(["training", "training-high"])))
        assert log(ev.JobSubmitted, job_id=f"p{p}", spec=spec, time=now - 5).accepted
    return log, now


def config_for(data) -> PreemptionConfig:
    base = random_config(data)
    return replace(base, placement=data.draw(st.sampled_from(sorted(PLACEMENTS))),
                   max_victims=data.draw(st.sampled_from([None, 64])),
                   defrag_max_plans=data.draw(st.sampled_from([1, 32])))


@SETTINGS
@given(st.data())
def test_preemption_decisions_are_those_of_fresh_views(data):
    log, now = busy_cluster(data)
    config = config_for(data)
    before = digest(log.state)
    expected = oracle.preemption_decisions(log.state, now, config)
    assert digest(log.state) == before
    assert preemption_decisions(log.state, now, config) == expected
    assert digest(log.state) == before


@SETTINGS
@given(st.data())
def test_defrag_plans_are_those_of_fresh_views(data):
    log, now = data.draw(st.sampled_from([busy_cluster, fragmented_cluster]))(data)
    config = config_for(data)
    before = digest(log.state)
    expected = oracle.defrag_decisions(log.state, now, config)
    assert digest(log.state) == before
    assert defrag_decisions(log.state, now, config) == expected
    assert digest(log.state) == before


@SETTINGS
@given(st.data())
def test_kept_free_whole_gpus_agree_with_a_scan(data):
    """Defragmentation's kept count of free whole GPUs (``FreeWholeGpus``) says what a scan
    of the pool says, through bookings, released jobs and cordoned nodes of the call."""
    log, now = data.draw(st.sampled_from([busy_cluster, fragmented_cluster]))(data)
    state = log.state
    ctx = SearchContext(state, now, config_for(data))
    pending = [state.jobs[j] for j in sorted(state.pending)]
    running = [j for j in state.jobs.values() if j.phase in (JobPhase.RUNNING, JobPhase.PLACED)]
    with ctx.tentative() as scratch:
        for _ in range(data.draw(st.integers(1, 6))):
            for job in pending:
                assert _blocked(ctx, job) == blocked_by_fragmentation(state, job)
            step = data.draw(st.sampled_from(["book", "release", "cordon"]))
            if step == "book" and pending:
                job = pending.pop(0)
                placed = ctx.place(job)
                if placed is not None:
                    scratch.book(job, placed)
            elif step == "release" and running:
                scratch.release(running.pop(data.draw(st.integers(0, len(running) - 1))))
            elif step == "cordon":
                scratch.nominate([data.draw(st.sampled_from(sorted(state.nodes)))])
