"""``Cluster``: the fair-share tests' cluster of ``NODES`` nodes, built through the reducer,
where teams hold (place and run) jobs."""
from __future__ import annotations

import dataclasses

from gpusched.core import events as ev
from tests.unit.core.builders import Log, make_node, make_spec, whole


# 4 nodes x 8 GPUs, 64 cores, 512 GiB: capacity 32 GPUs, 256 cores, 2 TiB.
NODES = 4


class Cluster:
    def __init__(self, nodes: int = NODES, gpus: int = 8) -> None:
        self.log = Log(*(make_node(f"n{i}", gpus=gpus, cpu=64_000, mem=512_000) for i in range(nodes)))
        self.state = self.log.state
        self.n = 0

    def hold(self, team: str, gpus: int, cpu: int = 0, node: str | None = None) -> str:
        """A running job of ``team`` holding ``gpus`` whole GPUs and ``cpu`` milli."""
        job_id = f"run-{self.n}"
        self.n += 1
        assert self.log.submit(job_id, make_spec(team, gpus=gpus, cpu=cpu, mem=0)).accepted
        target = node or next(n.name for n in self.state.nodes.values()
                              if n.free_whole_gpus() >= gpus and n.free_cpu >= cpu)
        free = [g.info.index for g in self.state.nodes[target].gpus if g.fits_whole()][:gpus]
        self.log.run(job_id, (target, whole(*free)))
        return job_id

    def submit(self, job_id: str, team: str, gpus: int = 1, at: float | None = None, **kw) -> None:
        spec = dataclasses.replace(make_spec(team, gpus=gpus, cpu=0, mem=0, name=job_id), **kw)
        extra = {"time": at} if at is not None else {}
        assert self.log(ev.JobSubmitted, job_id=job_id, spec=spec, **extra).accepted

    def pending(self):
        return [self.state.jobs[j] for j in self.state.pending]
