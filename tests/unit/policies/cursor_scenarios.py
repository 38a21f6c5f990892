"""Scenarios for the tests of the budget of jobs tested per cycle and its carry-over cursor:
job shapes and ``spec``, random ``scenarios`` (nodes, waiting jobs, ends and arrivals
between cycles), ``run_cycle``, ``end_and_arrive`` and ``deep_queue``."""
from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from gpusched.core import events as ev
from gpusched.core.model import JobPhase
from gpusched.policies.memory import CycleMemory
from gpusched.policies.queueing.parking import ParkedJobs
from gpusched.policies.scheduler import Scheduler
from tests.unit.core.builders import Log, make_node, make_spec, whole


SHAPES = ((1, 1, 0), (1, 2, 0), (1, 8, 0), (2, 4, 0), (1, 0, 500))   # (workers, gpus, milli)
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def spec(team: str, shape: tuple, name: str, limit: float = 0.0, priority_class: str = "training"):
    workers, gpus, milli = shape
    return dataclasses.replace(make_spec(team, workers=workers, gpus=gpus, milli=milli, cpu=0, mem=0, name=name,
                                         priority_class=priority_class), max_runtime_s=limit)


def run_cycle(log: Log, scheduler: Scheduler, memory: CycleMemory, parking: bool) -> list:
    """One cycle with ``memory``; without ``parking`` no job stays parked between cycles."""
    if not parking:
        memory.parked = ParkedJobs()
    result = scheduler.schedule(log.state, log.now, memory)
    for d in result.decisions:
        assert log.place(d.job_id, *[(w.node, w.gpus) for w in d.workers]).accepted
    return sorted((d.job_id, d.workers, d.backfilled) for d in result.decisions)


@st.composite
def scenarios(draw):
    """Nodes, waiting jobs, and what happens between cycles (jobs end, jobs arrive)."""
    nodes = draw(st.integers(1, 3))
    waiting = [(draw(st.sampled_from("abc")), draw(st.sampled_from(SHAPES)), float(draw(st.sampled_from([0, 50]))))
               for _ in range(draw(st.integers(1, 30)))]
    between = [(draw(st.integers(0, 2)), [(draw(st.sampled_from("abc")), draw(st.sampled_from(SHAPES)))
                                          for _ in range(draw(st.integers(0, 3)))])
               for _ in range(draw(st.integers(1, 5)))]
    return nodes, waiting, between


def end_and_arrive(log: Log, ends: int, arrivals: list, make=spec) -> None:
    """Between two cycles: the first ``ends`` placed jobs end, then ``arrivals`` (team,
    shape) are submitted, each made by ``make(team, shape, name)``."""
    for job_id in [j for j, job in log.state.jobs.items() if job.phase is JobPhase.PLACED][:ends]:
        assert log(ev.JobCancelled, job_id=job_id, reason="ended").accepted
        log.stopped(job_id, code=0, signal=0)   # its GPUs are free once its workers report their end
    for team, shape in arrivals:
        n = log.state.next_seq
        log.submit(f"a{n}", make(team, shape, f"a{n}"))


def deep_queue(blocked: int, queue: str) -> Log:
    """One node with 1 GPU free, ``blocked`` waiting 2-GPU jobs that cannot fit, then one
    1-GPU job that fits."""
    log = Log(make_node("n0", gpus=8, cpu=64_000, mem=512_000))
    log.submit("run", spec("r", (1, 7, 0), "run"))
    assert log.place("run", ("n0", whole(*range(7)))).accepted
    for i in range(blocked):
        log.submit(f"b{i:03d}", spec("a", (1, 2, 0), f"b{i}"))
    log.submit("deep", spec("a", (1, 1, 0), "deep"))
    return log
