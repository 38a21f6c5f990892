"""Small hand-built clusters for the preemptor's tests: ``Cluster`` (a Log with helpers to
put jobs in the states the tests need, at chosen times), the priority classes by short
name (``BE``, ``TR``, ``HI``, ``PROD``), the clock (``NOW``) and ``quotas``."""
from __future__ import annotations

from gpusched.core import events as ev
from gpusched.core.digest import digest
from gpusched.core.model import JobPhase
from gpusched.policies.memory import CycleMemory
from gpusched.policies.statement import tentative
from gpusched.policies.placement.gang import place_gang
from gpusched.policies.placement.registry import make_placement
from gpusched.policies.preemption.decisions import Preemption, preemption_decisions, preemption_events, victims_for
from gpusched.policies.queueing.quota import OrgQuota, QueueTree, TeamQuota
from gpusched.policies.preemption.victim_rules import PreemptionConfig
from tests.unit.policies.preemption_configs import other_rules
from tests.unit.core.builders import Log, make_node, make_spec, whole


NOW = 10_000.0
BE, TR, HI, PROD = "best-effort", "training", "training-high", "production-inference"


class Cluster:
    """A Log with helpers to put jobs in the states the tests need, at chosen times."""

    def __init__(self, nodes: int = 2, gpus: int = 4, **node_kw) -> None:
        self.log = Log(*(make_node(f"n{i + 1}", gpus=gpus, **node_kw) for i in range(nodes)))
        self.state = self.log.state

    def pending(self, job_id: str, *, at: float = NOW - 5, **spec_kw) -> None:
        spec_kw.setdefault("cpu", 0)
        spec_kw.setdefault("mem", 0)
        assert self.log(ev.JobSubmitted, job_id=job_id, spec=make_spec(name=job_id, **spec_kw), time=at).accepted

    def running(self, job_id: str, *placements, started: float = NOW - 1000, ckpt: float | None = None,
                start: bool = True, **spec_kw) -> None:
        """``placements``: (node, gpu indexes) per worker."""
        if "gpus" not in spec_kw and "milli" not in spec_kw and "mig" not in spec_kw:
            spec_kw["gpus"] = len(placements[0][1])
        spec_kw.setdefault("workers", len(placements))
        self.pending(job_id, at=started - 10, **spec_kw)
        out = self.log(ev.JobPlaced, job_id=job_id, attempt=0, time=started,
                       workers=tuple(ev.WorkerAssignment(i, node, whole(*idx))
                                     for i, (node, idx) in enumerate(placements)))
        assert out.accepted, out.reason
        if start:
            for i, (node, _) in enumerate(placements):
                assert self.log(ev.WorkerStarted, job_id=job_id, attempt=0, worker=i, node=node,
                                time=started).accepted
        if ckpt is not None:
            assert self.log(ev.CheckpointSaved, job_id=job_id, attempt=0, checkpoint=f"s3://{job_id}",
                            time=ckpt).accepted

    def job(self, job_id: str):
        return self.state.jobs[job_id]

    # --- the policy calls, each checked to leave the state as it was ------------------
    def victims(self, job_id: str, config: PreemptionConfig = other_rules(), now: float = NOW):
        before = digest(self.state)
        out = victims_for(self.state, self.job(job_id), now, CycleMemory(), config)
        assert digest(self.state) == before
        return out

    def decisions(self, config: PreemptionConfig = other_rules(), now: float = NOW, limit: int = 8) -> list[Preemption]:
        before = digest(self.state)
        out = preemption_decisions(self.state, now, CycleMemory(), config, limit)
        assert digest(self.state) == before
        return out

    def preempt(self, decision: Preemption, now: float = NOW) -> None:
        """Apply the decision through the reducer, then let every victim worker finish."""
        for e in preemption_events(self.state, decision, now):
            assert self.log.replay(e).accepted
        for vid in decision.victims:
            victim = self.job(vid)
            assert victim.phase is JobPhase.PREEMPTING
            for w in victim.workers:
                assert self.log(ev.WorkerFinished, job_id=vid, attempt=victim.attempt, worker=w.worker,
                                node=w.node, exit_code=0, time=now).accepted
            assert victim.phase is JobPhase.PENDING

    def placeable(self, job_id: str) -> bool:
        with tentative(self.state) as statement:
            return place_gang(self.state, self.job(job_id), make_placement("best-fit"), statement) is not None


def quotas(**guaranteed_gpus: float) -> PreemptionConfig:
    tree = QueueTree(orgs={"org": OrgQuota(teams={t: TeamQuota(guaranteed_gpus=g)
                                                   for t, g in guaranteed_gpus.items()})})
    return other_rules(quotas=tree)
