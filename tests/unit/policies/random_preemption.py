"""Random clusters, jobs and preemptor configurations for the property tests of victim
selection (``build``, ``random_spec``, ``random_config``, their ``SETTINGS``), and
``fits_without``: whether a job fits once its victims are gone."""
from __future__ import annotations

import math

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from gpusched.core import events as ev
from gpusched.core.capacity import commit, release
from gpusched.core.model import JobPhase, JobSpec, WorkerResources
from gpusched.core.priority import PRIORITY_CLASSES
from gpusched.policies.memory import CycleMemory
from gpusched.policies.statement import tentative
from gpusched.policies.placement.gang import place_gang
from gpusched.policies.placement.registry import make_placement
from gpusched.policies.queueing.quota import OrgQuota, QueueTree, TeamQuota
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
        for dec in Scheduler().cycle(log.state, t, CycleMemory()):
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
