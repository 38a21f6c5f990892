"""EASY backfill: the blocked head of line gets a reservation; jobs behind it run only
where they cannot delay it."""
from __future__ import annotations

import dataclasses
import math

import pytest

from gpusched.core import events as ev
from gpusched.core.digest import digest
from gpusched.core.model import JobSpec, WorkerAssignment, WorkerResources
from gpusched.policies.memory import CycleMemory
from gpusched.policies.reservation.backfill import expected_end, reserve_for_head_of_line
from gpusched.policies.scheduler import Scheduler, SchedulerConfig
from gpusched.policies.statement import Statement
from gpusched.sim.dynamic import DynamicSimulator
from gpusched.sim.workload import Arrival, Workload
from tests.unit.core.builders import make_node, share, whole
from tests.unit.policies.backfill_clusters import NOW, spec, Cluster, gang_behind_busy_cluster


def test_reservation_is_at_the_earliest_time_every_worker_fits():
    c = gang_behind_busy_cluster()
    reservation = reserve_for_head_of_line(Statement(c.state), c.state.jobs["gang"], NOW)
    assert reservation is not None
    assert reservation.shadow_s == 5000
    assert sorted(w.node for w in reservation.workers) == ["n1", "n2"]
    assert [w.worker for w in reservation.workers] == [0, 1]


@pytest.mark.parametrize("runtime, backfilled", [
    (3_000, True),      # ends at 3100, before the gang's 5000: runs now on n2's free GPUs
    (4_900, True),      # ends at 5000 exactly: still in time
    (6_000, False),     # would still hold n2's GPUs at 5000: would delay the gang
    (0, False),         # unknown runtime: might never end
])
def test_small_job_is_backfilled_only_if_it_cannot_delay_the_gang(runtime, backfilled):
    c = gang_behind_busy_cluster()
    c.pending("small", runtime, gpus=4)
    decisions = c.cycle(backfill=True)
    assert [(d.job_id, d.backfilled) for d in decisions] == ([("small", True)] if backfilled else [])


@pytest.mark.parametrize("runtime", [3_000, 6_000, 0])
def test_without_backfill_the_small_job_always_jumps_the_gang(runtime):
    c = gang_behind_busy_cluster()
    c.pending("small", runtime, gpus=4)
    assert [d.job_id for d in c.cycle(backfill=False)] == ["small"]


def test_long_job_may_use_capacity_the_reservation_does_not_need():
    # The head needs one whole node; n1 frees first (1000), so the reservation is n1 and
    # a long job may take n2's free GPUs.
    c = Cluster()
    c.running("r1", "n1", whole(*range(8)), 1000, gpus=8)
    c.running("r2", "n2", whole(0, 1, 2, 3), 5000, gpus=4)
    c.pending("head", 10_000, gpus=8)
    c.pending("long", 99_999, gpus=4)
    decisions = c.cycle()
    assert [(d.job_id, d.workers[0].node, d.backfilled) for d in decisions] == [("long", "n2", True)]


def test_short_job_may_use_a_gpu_share_the_reservation_holds():
    # One GPU, half used until 2000. The head (600 milli) must wait; a 400-milli job that
    # ends by 2000 may run now; one that outlives it may not, as the hold keeps the GPU.
    c = Cluster(nodes=1, gpus=1)
    c.running("r", "n1", share(0, 500), 2000, milli=500)
    c.pending("head", 10_000, milli=600)
    c.pending("long", 5_000, milli=400)
    c.pending("short", 1_500, milli=400)
    assert [d.job_id for d in c.cycle()] == ["short"]


def test_only_the_first_blocked_job_gets_a_reservation():
    c = gang_behind_busy_cluster()
    c.pending("second", 10_000, gpus=8)
    c.pending("small", 1_000, gpus=2)
    scheduler = Scheduler(SchedulerConfig(queue="fifo", backfill=True))
    assert [d.job_id for d in scheduler.cycle(c.state, NOW, CycleMemory())] == ["small"]
    assert scheduler.reservation.job.job_id == "gang"


def test_no_reservation_behind_jobs_of_unknown_runtime():
    c = Cluster(nodes=1)
    c.running("forever", "n1", whole(*range(8)), 0, gpus=8)
    c.pending("head", 10_000, gpus=8)
    assert reserve_for_head_of_line(Statement(c.state), c.state.jobs["head"], NOW) is None


def test_a_job_that_never_fits_does_not_block_the_queue():
    # 16 GPUs on one worker fits no node: no reservation, and the job behind still runs.
    c = Cluster()
    c.pending("huge", 10_000, gpus=16)
    c.pending("small", 99_999, gpus=2)
    assert [(d.job_id, d.backfilled) for d in c.cycle()] == [("small", False)]


@pytest.mark.parametrize("runtime, expected", [
    (1000.0, 1000.0),
    (0.0, math.inf),       # unknown runtime
    (50.0, NOW),           # past its estimate: ends any moment
])
def test_expected_end(runtime, expected):
    c = Cluster()
    c.running("r", "n1", whole(0), runtime, gpus=1)
    assert expected_end(c.state.jobs["r"], NOW) == expected


def test_cycle_leaves_the_state_as_the_log_made_it():
    c = gang_behind_busy_cluster()
    c.pending("small", 3_000, gpus=4)
    c.pending("long", 6_000, gpus=2)
    before = digest(c.state)
    assert c.cycle()
    assert digest(c.state) == before


# --- the gang does not starve ------------------------------------------------------------
def starving_gang_workload() -> Workload:
    """A 16-GPU gang arrives on two busy 8-GPU nodes while 4-GPU jobs of 100 s keep
    arriving every 50 s until t=2000: there is always one to take freed GPUs."""
    nodes = tuple(make_node(f"n{i}", gpus=8, cpu=64_000, mem=512_000) for i in range(2))
    small = WorkerResources(gpus=4)
    arrivals = [Arrival(50.0 * i, f"s{i:03d}", JobSpec(name=f"s{i:03d}", team="t", resources=small,
                                                       max_runtime_s=100, simulated_duration_s=100))
                for i in range(40)]
    gang = JobSpec(name="gang", team="t", workers=2, resources=WorkerResources(gpus=8),
                   max_runtime_s=500, simulated_duration_s=500)
    arrivals.append(Arrival(60.0, "gang", gang))
    return Workload("starving-gang", nodes, tuple(sorted(arrivals, key=lambda a: (a.time, a.job_id))))


@pytest.mark.parametrize("backfill, reserve_after_s, starts_before", [
    (True, math.inf, 300.0),              # EASY: reserved at once, starts when the small jobs in its way end
    (False, 300.0, 60.0 + 300 + 100),     # no backfill: reserved once it waited 300 s, starts within a runtime
])
def test_reserved_gang_starts_by_its_shadow_time(backfill, reserve_after_s, starts_before):
    config = SchedulerConfig(queue="fifo", backfill=backfill, reserve_after_s=reserve_after_s)
    result = DynamicSimulator(starving_gang_workload(), config).run()
    gang = next(j for j in result.jobs if j.job_id == "gang")
    assert gang.started_at <= starts_before


def test_the_gang_starves_without_reservations():
    config = SchedulerConfig(queue="fifo", backfill=False, reserve_after_s=math.inf)
    result = DynamicSimulator(starving_gang_workload(), config).run()
    gang = next(j for j in result.jobs if j.job_id == "gang")
    assert gang.started_at >= 1950.0     # only once the stream of small jobs stopped


def test_the_hold_keeps_the_gpu_memory_a_reserved_share_needs():
    # One GPU, a share holding 60 GB until 2000. The head needs 30 GB more than is free,
    # so it waits; a later share asking 15 GB, free now, would leave the head short at
    # 2000 if it outlived it: it must not run. (Milli alone would let it.)
    def mem(s: JobSpec, mib: int) -> JobSpec:
        return dataclasses.replace(s, resources=dataclasses.replace(s.resources, gpu_memory_mib=mib))
    c = Cluster(nodes=1, gpus=1)
    assert c.log(ev.JobSubmitted, job_id="r", spec=mem(spec("r", 2000, milli=300), 60_000), time=0.0).accepted
    assert c.log(ev.JobPlaced, job_id="r", attempt=0, time=0.0, workers=(WorkerAssignment(0, "n1", share(0, 300)),)).accepted
    assert c.log(ev.JobSubmitted, job_id="head", spec=mem(spec("head", 10_000, milli=300), 70_000), time=1.0).accepted
    assert c.log(ev.JobSubmitted, job_id="long", spec=mem(spec("long", 5_000, milli=100), 15_000), time=1.0).accepted
    assert [d.job_id for d in c.cycle()] == []
