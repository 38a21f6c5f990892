"""Random clusters and preemptor rules for the tests of the preemptor's indexes (its
placer views, the victim index): clusters partly filled by a scheduler's cycles
(``busy_cluster``), fragmented (``fragmented_cluster``) or packed with 1- and 2-GPU jobs
and gangs (``packed_cluster``), and random rules (``config_for``, ``random_rules``)."""
from __future__ import annotations

import math
from dataclasses import replace

from hypothesis import strategies as st

from gpusched.core import events as ev
from gpusched.core.model import JobPhase
from gpusched.policies.memory import CycleMemory
from gpusched.policies.placement.registry import PLACEMENTS
from gpusched.policies.preemption.victim_rules import PreemptionConfig
from gpusched.policies.queueing.quota import OrgQuota, QueueTree, TeamQuota
from gpusched.policies.scheduler import Scheduler
from tests.unit.core.builders import Log, make_node, make_spec, whole
from tests.unit.policies.preemption_clusters import BE, HI, NOW, PROD, TR, Cluster
from tests.unit.policies.preemption_configs import other_rules
from tests.unit.policies.random_preemption import CLASSES, random_config, random_spec


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
        for dec in Scheduler().cycle(log.state, t, CycleMemory()):
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


TEAMS = ["a", "b", "c"]


def _running(c: Cluster, job_id: str, placements: list[tuple[str, tuple[int, ...]]], data) -> None:
    """``job_id`` placed on ``placements`` (node, GPUs) per worker, with a random class, team,
    age, checkpoint and history of preemptions (real ones: preempted for priority or
    reclaim, its workers finished, placed again)."""
    d = data.draw
    started = NOW - d(st.sampled_from([10.0, 100.0, 700.0, 1500.0, 5000.0]))
    preemptible = d(st.integers(0, 5)) > 0
    preempted = d(st.sampled_from([0, 0, 0, 1, 3])) if preemptible else 0
    spec = dict(gpus=len(placements[0][1]), workers=len(placements), cpu=0, mem=0,
                priority_class=d(st.sampled_from([BE, BE, TR, TR, HI])), team=d(st.sampled_from(TEAMS)),
                preemptible=preemptible)
    c.pending(job_id, at=started - 100 * (preempted + 1), **spec)
    assigned = tuple(ev.WorkerAssignment(i, node, whole(*gpus)) for i, (node, gpus) in enumerate(placements))
    for attempt in range(preempted + 1):
        at = started - 100 * (preempted - attempt)
        assert c.log(ev.JobPlaced, job_id=job_id, attempt=attempt, workers=assigned, time=at).accepted
        if attempt == preempted and d(st.integers(0, 5)) == 0:
            return   # placed, never started
        for w in assigned:
            assert c.log(ev.WorkerStarted, job_id=job_id, attempt=attempt, worker=w.worker, node=w.node,
                         time=at).accepted
        if attempt < preempted:
            why = d(st.sampled_from(["priority", "reclaim"]))
            assert c.log(ev.JobPreempted, job_id=job_id, attempt=attempt, for_job="x",
                         reason=f"{why}: preempted for x", time=at + 50).accepted
            for w in assigned:
                assert c.log(ev.WorkerFinished, job_id=job_id, attempt=attempt, worker=w.worker, node=w.node,
                             exit_code=0, time=at + 50).accepted
    if d(st.booleans()):
        assert c.log(ev.CheckpointSaved, job_id=job_id, attempt=preempted, checkpoint="c",
                     time=d(st.sampled_from([started + 5.0, NOW - 50.0]))).accepted


def packed_cluster(data) -> tuple[Cluster, float]:
    """Nodes mostly full of 1- and 2-GPU jobs and of jobs with one worker on each of two
    nodes; then several pending jobs of high classes, some of them gangs."""
    d = data.draw
    gpus = d(st.sampled_from([4, 8]))
    nodes = d(st.integers(2, 6))
    c = Cluster(nodes=nodes, gpus=gpus)
    free = {f"n{i + 1}": 0 for i in range(nodes)}   # node -> first free GPU
    k = 0
    for i in range(nodes):
        name = f"n{i + 1}"
        while free[name] < gpus:
            kind = d(st.sampled_from(["one", "one", "two", "spread", "hole"]))
            size = 2 if kind == "two" else 1
            if kind == "hole":
                free[name] += 1
                continue
            if kind == "spread" and i + 1 < nodes and free[f"n{i + 2}"] < gpus:
                other = f"n{i + 2}"
                _running(c, f"r{k}", [(name, (free[name],)), (other, (free[other],))], data)
                free[other] += 1
            else:
                size = min(size, gpus - free[name])
                _running(c, f"r{k}", [(name, tuple(range(free[name], free[name] + size)))], data)
            free[name] += size
            k += 1
    for p in range(d(st.integers(1, 5))):
        c.pending(f"p{p}", gpus=d(st.sampled_from([1, 1, 2, gpus])), workers=d(st.sampled_from([1, 1, 2, 3])),
                  priority_class=d(st.sampled_from([HI, HI, PROD, TR])), team=d(st.sampled_from(TEAMS)))
    return c, NOW


def random_rules(data) -> PreemptionConfig:
    d = data.draw
    teams = {t: TeamQuota(guaranteed_gpus=d(st.sampled_from([0, 0, 1, 2, 4, 8]))) for t in TEAMS}
    return other_rules(
        # No exempt time nor budget, often: many equal costs, the search's tie-breaks.
        min_runtime_s=d(st.sampled_from([0.0, 0.0, 300.0, 600.0])), min_runtime_growth=d(st.sampled_from([1.0, 2.0])),
        max_min_runtime_s=d(st.sampled_from([600.0, 3600.0])), preemption_budget=d(st.sampled_from([0, 0, 1, 3])),
        reclaim_min_runtime_s=d(st.sampled_from([0.0, 30.0, 1000.0])),
        reclaim_window_s=d(st.sampled_from([0.0, 600.0, 10_000.0])),
        max_victims=d(st.sampled_from([None, None, 2, 64])), placement=d(st.sampled_from(sorted(PLACEMENTS))),
        quotas=QueueTree(orgs={"o": OrgQuota(teams=teams)}),
        max_loss_per_wait=d(st.sampled_from([math.inf, math.inf, 0.5, 50.0])))
