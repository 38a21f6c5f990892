"""Small hand-built clusters for the defragmentation tests: ``Cluster``, the priority
classes by short name (``BE``, ``TR``, ``HI``), the clock (``NOW``) and ``fragmented``
(8 free GPUs in total, no 8-GPU hole)."""
from __future__ import annotations

from gpusched.core import events as ev
from gpusched.core.digest import digest
from gpusched.policies.memory import CycleMemory
from gpusched.policies.statement import tentative
from gpusched.policies.preemption.defrag import defrag_decisions, defrag_plan
from gpusched.policies.placement.gang import place_gang
from gpusched.policies.placement.registry import make_placement
from gpusched.policies.preemption.victim_rules import PreemptionConfig
from tests.unit.core.builders import Log, make_node, make_spec, whole


NOW = 10_000.0
BE, TR, HI = "best-effort", "training", "training-high"


class Cluster:
    def __init__(self, gpus: tuple[int, ...] = (8, 8, 8)) -> None:
        self.log = Log(*(make_node(f"n{i + 1}", gpus=g) for i, g in enumerate(gpus)))
        self.state = self.log.state

    def pending(self, job_id: str, at: float = NOW - 5, **kw) -> None:
        kw.setdefault("cpu", 0)
        kw.setdefault("mem", 0)
        assert self.log(ev.JobSubmitted, job_id=job_id, spec=make_spec(name=job_id, **kw), time=at).accepted

    def running(self, job_id: str, node: str, gpus: tuple[int, ...], *, ckpt_every: float = 300.0,
                ckpt: float | None = NOW - 60, started: float = NOW - 1000, **kw) -> None:
        kw.setdefault("cpu", 0)
        kw.setdefault("mem", 0)
        spec = make_spec(name=job_id, gpus=len(gpus), **kw)
        spec = type(spec)(**{**{f: getattr(spec, f) for f in spec.__dataclass_fields__},
                             "checkpoint_interval_s": ckpt_every})
        assert self.log(ev.JobSubmitted, job_id=job_id, spec=spec, time=started - 1).accepted
        assert self.log(ev.JobPlaced, job_id=job_id, attempt=0, time=started,
                        workers=(ev.WorkerAssignment(0, node, whole(*gpus)),)).accepted
        assert self.log(ev.WorkerStarted, job_id=job_id, attempt=0, worker=0, node=node, time=started).accepted
        if ckpt is not None:
            assert self.log(ev.CheckpointSaved, job_id=job_id, attempt=0, checkpoint="c", time=ckpt).accepted

    def decisions(self, config: PreemptionConfig = PreemptionConfig(), now: float = NOW):
        before = digest(self.state)
        out = defrag_decisions(self.state, now, CycleMemory(), config)
        assert digest(self.state) == before
        return out

    def plan(self, job_id: str, config: PreemptionConfig = PreemptionConfig(), now: float = NOW):
        before = digest(self.state)
        out = defrag_plan(self.state, self.state.jobs[job_id], now, CycleMemory(), config)
        assert digest(self.state) == before
        return out

    def fits(self, *job_ids: str) -> bool:
        with tentative(self.state) as statement:
            return all(place_gang(self.state, self.state.jobs[j], make_placement("best-fit"), statement) is not None
                       for j in job_ids)


def fragmented() -> Cluster:
    """n1 and n2 have 4 free GPUs each, n3 is full: 8 free in total, no 8-GPU hole."""
    c = Cluster()
    c.running("a", "n1", (0, 1, 2, 3))
    c.running("b", "n2", (0, 1, 2, 3), ckpt=NOW - 120)
    c.running("full", "n3", tuple(range(8)), preemptible=False)
    c.pending("big", gpus=8)
    return c
