"""The preemptor's gate (``gpusched.policies.preemption.gate``): a round skips its searches for
victims only where they would propose nothing, so its decisions are those of a round that
runs them all, round after round as the log moves; and a burst of one class of jobs,
where nothing can be preempted, runs no search."""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gpusched.core import events as ev
from gpusched.core.model import JobPhase
from gpusched.policies.actions import DEFAULT_ACTIONS, make_actions
from gpusched.policies.memory import CycleMemory
from gpusched.policies.preemption.victim_rules import PreemptionConfig
from gpusched.policies.queueing.quota import QueueTree, TeamQuota
from gpusched.policies.scheduler import Scheduler
from gpusched.policies.supervision import SupervisionConfig
from gpusched_preemptor import decide as decide_module
from gpusched_preemptor.decide import PreemptorDecider
from gpusched.policies.preemption.gate import PossibleVictims
from tests.unit.policies.preemption_configs import other_rules
from tests.unit.policies.defrag_clusters import BE, HI, NOW, TR, Cluster
from tests.unit.policies.random_preemption import SETTINGS

SUPERVISION = SupervisionConfig(heartbeat_timeout_s=10.0)
CLASSES = (BE, TR, HI)


def decider(config: PreemptionConfig) -> PreemptorDecider:
    heard = {"n1": NOW, "n2": NOW, "n3": NOW}
    return PreemptorDecider("p", config, SUPERVISION, lambda now: (heard, 0.0, True), make_actions(DEFAULT_ACTIONS))


class Ungated(PreemptorDecider):
    """Every round runs every action, as before the gate."""

    def _actions(self, partition, situation):
        return self.actions


def ungated(config: PreemptionConfig) -> PreemptorDecider:
    heard = {"n1": NOW, "n2": NOW, "n3": NOW}
    return Ungated("p", config, SUPERVISION, lambda now: (heard, 0.0, True), make_actions(DEFAULT_ACTIONS))


def fields(event) -> tuple:
    names = [f for f in event.__dataclass_fields__ if f not in ("event_id", "time", "producer")]
    return (type(event).__name__, *(getattr(event, f) for f in names))


def decided(d: PreemptorDecider, c: Cluster, now: float) -> list[tuple]:
    return [fields(e) for e, _ in d(0, c.state, now)]


@st.composite
def clusters(draw):
    c = Cluster()
    free = {f"n{i}": list(range(8)) for i in (1, 2, 3)}
    for i in range(draw(st.integers(0, 8))):   # up to a full cluster: searches have work
        node = draw(st.sampled_from(sorted(free)))
        n = draw(st.sampled_from((2, 4, 8)))
        if len(free[node]) < n:
            continue
        gpus, free[node] = tuple(free[node][:n]), free[node][n:]
        c.running(f"r{i}", node, gpus, priority_class=draw(st.sampled_from(CLASSES)),
                  preemptible=draw(st.booleans()), ckpt_every=draw(st.sampled_from((0.0, 300.0))),
                  team=draw(st.sampled_from(("team-a", "team-b"))))
    for i in range(draw(st.integers(0, 5))):
        c.pending(f"p{i}", gpus=draw(st.sampled_from((1, 4, 8))), priority_class=draw(st.sampled_from(CLASSES)),
                  team=draw(st.sampled_from(("team-a", "team-b"))))
    return c


def _step(c: Cluster, kind: str, now: float) -> None:
    """What the log brings between two rounds: jobs placed, or a running job's end."""
    if kind == "place":
        for dec in Scheduler().cycle(c.state, now, CycleMemory())[:3]:
            c.log(ev.JobPlaced, job_id=dec.job_id, attempt=dec.attempt, workers=dec.workers, time=now)
        return
    running = sorted(j.job_id for j in c.state.jobs.values() if j.phase in (JobPhase.RUNNING, JobPhase.PLACED))
    if running:
        job = c.state.jobs[running[0]]
        for w in job.workers:
            c.log(ev.WorkerFinished, job_id=job.job_id, attempt=job.attempt, worker=w.worker, node=w.node,
                  exit_code=0, time=now)


@SETTINGS
@given(c=clusters(), guaranteed=st.sampled_from((0.0, 4.0)),
       steps=st.lists(st.sampled_from(("place", "finish")), max_size=3))
def test_a_gated_round_decides_as_one_that_runs_every_action(c, guaranteed, steps):
    config = other_rules(quotas=QueueTree(default_team=TeamQuota(guaranteed_gpus=guaranteed)))
    gated = decider(config)
    now = NOW
    for kind in ["none", *steps]:
        if kind != "none":
            now += 1.0
            _step(c, kind, now)
        assert decided(gated, c, now) == decided(ungated(config), c, now)
        fresh = PossibleVictims()
        fresh.refresh(c.state)
        kept = gated.memory[0].possible
        assert (kept.jobs, kept.classes, kept.movable) == (fresh.jobs, fresh.classes, fresh.movable)


def test_a_burst_of_one_class_runs_no_search_and_a_higher_class_does(monkeypatch):
    searched: list[int] = []
    real = decide_module.run_actions
    monkeypatch.setattr(decide_module, "run_actions",
                        lambda actions, s: searched.append(sum(a.name in ("preempt", "defrag") for a in actions))
                        or real(actions, s))
    c = Cluster()
    for i in range(3):
        c.running(f"r{i}", f"n{i + 1}", tuple(range(8)), priority_class=TR, ckpt_every=0.0)
    for i in range(4):
        c.pending(f"p{i}", gpus=1, priority_class=TR)
    d = decider(other_rules())
    assert d(0, c.state, NOW) == []
    c.pending("urgent", gpus=1, priority_class=HI)
    assert [type(e) for e, _ in d(0, c.state, NOW + 1)] == [ev.JobPreempted]
    assert searched == [0, 2]


def test_a_guarantee_keeps_the_searches_for_a_reclaim_among_jobs_of_one_class():
    config = other_rules(quotas=QueueTree(default_team=TeamQuota(guaranteed_gpus=8.0)))
    c = Cluster()
    for i in range(3):   # team-b holds 24 GPUs: 16 of them borrowed
        c.running(f"r{i}", f"n{i + 1}", tuple(range(8)), priority_class=TR, ckpt_every=0.0, team="team-b")
    c.pending("mine", gpus=8, priority_class=TR, team="team-a")
    out = [e for e, _ in decider(config)(0, c.state, NOW)]
    assert [type(e) for e in out] == [ev.JobPreempted] and "reclaim" in out[0].reason
