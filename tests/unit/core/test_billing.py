"""Billing charges what ran, from the reducer's outcomes."""
from __future__ import annotations

import pytest

from gpusched.consumers.billing import BillingLedger
from gpusched.core import events as ev
from gpusched.core.model import GpuSlot, JobSpec, WorkerAssignment, WorkerResources
from gpusched.core.reducer import apply
from gpusched.core.state import ClusterState
from tests.unit.core.builders import make_node


def _run(events):
    state, ledger = ClusterState(), BillingLedger()
    for e in events:
        outcome = apply(state, e)
        if outcome.accepted:
            for job_id in outcome.jobs:
                ledger.observe(state.jobs[job_id], e.time)
    return ledger


def _job(job_id, team, gpus, t0, placed, start, end, exit_code=0, nodes=("n1",)):
    spec = JobSpec(job_id, team, workers=len(nodes), resources=WorkerResources(gpus=gpus))
    workers = tuple(WorkerAssignment(i, n, tuple(GpuSlot(g) for g in range(gpus))) for i, n in enumerate(nodes))
    out = [ev.JobSubmitted(event_id=f"{job_id}s", time=t0, job_id=job_id, spec=spec),
           ev.JobPlaced(event_id=f"{job_id}p", time=placed, job_id=job_id, attempt=0, workers=workers)]
    out += [ev.WorkerStarted(event_id=f"{job_id}w{i}", time=start + i, job_id=job_id, attempt=0, worker=i, node=n)
            for i, n in enumerate(nodes)]
    out += [ev.WorkerFinished(event_id=f"{job_id}f{i}", time=end, job_id=job_id, attempt=0, worker=i, node=n,
                              exit_code=exit_code) for i, n in enumerate(nodes)]
    return out


@pytest.mark.parametrize("events, expected", [
    # 2 GPUs from the start at 10 to the end at 3610: exactly 2 GPU-hours.
    (_job("a", "t1", 2, 0, 5, 10, 3610), {"t1": 2.0}),
    # A gang is charged from when its last worker started (11), both workers' GPUs.
    (_job("g", "t2", 1, 0, 5, 10, 3611, nodes=("n1", "n2")), {"t2": 2.0}),
    # Placed but never started: nothing to pay.
    (_job("x", "t3", 1, 0, 5, 10, 3610)[:2], {}),
])
def test_charges_gpu_time_from_running_to_release(events, expected):
    assert _run([ev.NodeRegistered(event_id="n1", node=make_node("n1", 4)),
                 ev.NodeRegistered(event_id="n2", node=make_node("n2", 4)), *events]).gpu_hours() == pytest.approx(expected)


def test_a_failed_attempt_is_charged_up_to_its_failure_and_open_jobs_up_to_now():
    events = [ev.NodeRegistered(event_id="n1", node=make_node("n1", 4)),
              *_job("f", "t1", 1, 0, 0, 0, 1800, exit_code=1)]
    ledger = _run(events)
    assert ledger.gpu_hours() == pytest.approx({"t1": 0.5})
    assert ledger.gpu_hours(now=1e9) == pytest.approx({"t1": 0.5})   # requeued: nothing open
