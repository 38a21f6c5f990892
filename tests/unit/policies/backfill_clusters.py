"""Hand-built clusters for the backfill tests: ``Cluster`` (two 8-GPU nodes), ``spec`` (a
job of known runtime), the clock (``NOW``) and ``gang_behind_busy_cluster``."""
from __future__ import annotations

import dataclasses
import math

from gpusched.core import events as ev
from gpusched.core.model import JobSpec, WorkerAssignment
from gpusched.policies.memory import CycleMemory
from gpusched.policies.scheduler import Scheduler, SchedulerConfig
from tests.unit.core.builders import Log, make_node, make_spec, whole


NOW = 100.0


def spec(job_id: str, runtime: float, *, workers: int = 1, gpus: int = 0, milli: int = 0) -> JobSpec:
    return dataclasses.replace(make_spec("t", workers=workers, gpus=gpus, milli=milli, cpu=0, mem=0, name=job_id),
                               max_runtime_s=runtime)


class Cluster:
    """Two 8-GPU nodes; ``running`` jobs start at time 0 (expected end = their runtime)."""

    def __init__(self, nodes: int = 2, gpus: int = 8) -> None:
        self.log = Log(*(make_node(f"n{i + 1}", gpus=gpus, cpu=64_000, mem=512_000) for i in range(nodes)))
        self.state = self.log.state

    def running(self, job_id: str, node: str, slots, runtime: float, **kw) -> None:
        assert self.log(ev.JobSubmitted, job_id=job_id, spec=spec(job_id, runtime, **kw), time=0.0).accepted
        assert self.log(ev.JobPlaced, job_id=job_id, attempt=0, time=0.0,
                        workers=(WorkerAssignment(0, node, slots),)).accepted
        assert self.log(ev.WorkerStarted, job_id=job_id, attempt=0, worker=0, node=node, time=0.0).accepted

    def pending(self, job_id: str, runtime: float, **kw) -> None:
        assert self.log(ev.JobSubmitted, job_id=job_id, spec=spec(job_id, runtime, **kw), time=1.0).accepted

    def cycle(self, backfill: bool = True, queue: str = "fifo"):
        """EASY alone: no reservation for waiting past a bound, one reservation at most."""
        config = SchedulerConfig(queue=queue, backfill=backfill, reserve_after_s=math.inf, reservation_depth=1)
        return Scheduler(config).cycle(self.state, NOW, CycleMemory())


def gang_behind_busy_cluster() -> Cluster:
    """n1 full until 1000, n2 half full until 5000; a 2x8-GPU gang waits for both: its
    shadow time is 5000, and n2's 4 free GPUs are the only free capacity."""
    c = Cluster()
    c.running("r1", "n1", whole(*range(8)), 1000, gpus=8)
    c.running("r2", "n2", whole(0, 1, 2, 3), 5000, gpus=4)
    c.pending("gang", 10_000, workers=2, gpus=8)
    return c
