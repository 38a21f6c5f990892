"""The preemptor's actions: what it judges in one call, in a configured order (as
KAI-Scheduler's actions). Pure: each action reads a ``Situation`` (the state, the clock
and what was heard from the nodes) and returns proposals; the preemptor service turns
them into events.

An action that *stops* ends the call when it proposed something, so what it proposed
lands in the log before anything after it is judged on a state that does not show it
yet:

* ``nodes`` (stops): nodes whose heartbeats stopped are lost, lost nodes past their fence
  time are fenced. Judging attempts or victims on nodes about to be lost would be waste.
* ``attempts``: attempts past their time limit are timed out, attempts without progress
  reports are failed as hung. It does not stop: later actions judge the state with those
  attempts still holding their GPUs, which at worst costs a preemption their ends would
  have made unneeded.
* ``preempt`` (stops): victims for pending jobs that do not fit, by priority or by quota
  reclaim (one search: ``policies.preemption.decisions``; the reason says which).
* ``defrag`` (stops): checkpointable jobs to move for pending jobs blocked by
  fragmentation only (``policies.preemption.defrag``).

* ``autoscale``: services whose load calls for more or fewer replicas, by the HPA's rule
  (``policies.autoscaling``) over what their replicas measured. It does not stop: a
  scale changes no running job, and the replicas it adds are pending jobs as any.

``preempt`` and ``defrag`` each book their plans on their own tentative statement, so a
plan of one does not see the other's: that is why each stops, and why the default runs
``defrag`` only when ``preempt`` proposed nothing.

Priority preemption and quota reclaim are one action: they are one search over one
eligibility rule (a victim set may mix lower-priority jobs with borrowed capacity of the
same priority) and one cost order (lowest priority first, then borrowed first), and the
reason is read off the set found. Split into two actions, neither would find a mixed set.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Callable, Mapping, Sequence, Union

from gpusched.core.state import ClusterState
from gpusched.policies.autoscaling import ReplicaLoad, ScaleMemory, recommend
from gpusched.policies.preemption.decisions import Preemption, preemption_decisions
from gpusched.policies.preemption.defrag import defrag_decisions
from gpusched.policies.memory import CycleMemory
from gpusched.policies.preemption.victim_rules import PreemptionConfig
from gpusched.policies.supervision import (
    SupervisionConfig, hung_attempts, lost_nodes, nodes_to_fence, timed_out_attempts,
)


@dataclass(frozen=True, slots=True)
class NodeVerdict:
    """Declare ``node`` lost (``reason`` says why), or fence it (``fence``)."""

    node: str
    reason: str = ""
    fence: bool = False


@dataclass(frozen=True, slots=True)
class AttemptVerdict:
    """End an attempt: timed out (``timed_out``) or failed as hung."""

    job_id: str
    attempt: int
    reason: str
    timed_out: bool


@dataclass(frozen=True, slots=True)
class ScaleVerdict:
    """Set ``service``'s desired count to ``replicas`` (``reason`` says why)."""

    service: str
    replicas: int
    reason: str


Proposal = Union[NodeVerdict, AttemptVerdict, ScaleVerdict, Preemption]


class Situation:
    """What one call of the preemptor judges: a partition's state at ``now`` and what the
    heartbeats said. ``preemption`` is computed when an action first asks for it (the
    quotas of the log at this state's position), so a call that stops early pays nothing."""

    def __init__(self, state: ClusterState, now: float, supervision: SupervisionConfig,
                 preemption: Callable[[ClusterState], PreemptionConfig],
                 memory: CycleMemory, last_seen: Mapping[str, float] | None = None, since: float = 0.0,
                 hearing: bool = False, loads: Mapping[str, ReplicaLoad] | None = None,
                 scaling: dict[str, ScaleMemory] | None = None) -> None:
        self.state, self.now, self.supervision = state, now, supervision
        self.memory = memory        # what the searches keep between calls on this state (``policies.memory``)
        self.loads = loads if loads is not None else {}   # replica -> what it measured last
        self.scaling = scaling if scaling is not None else {}   # service -> the autoscaler's memory of it
        self._preemption = preemption
        self.last_seen = last_seen if last_seen is not None else {}
        self.since = since          # when listening began: a node never heard gets that long
        self.hearing = hearing      # heartbeats arrive at all: else no node is judged lost

    @cached_property
    def preemption(self) -> PreemptionConfig:
        return self._preemption(self.state)


@dataclass(frozen=True, slots=True)
class Action:
    """A named step of the preemptor's call. ``stops``: when it proposed something, the
    call ends after it."""

    name: str
    decide: Callable[[Situation], Sequence[Proposal]]
    stops: bool
    help: str


def judge_nodes(s: Situation) -> list[Proposal]:
    lost = lost_nodes(s.state, s.last_seen, s.since, s.now, s.supervision) if s.hearing else []
    out: list[Proposal] = [NodeVerdict(node, reason) for node, reason in lost]
    return out + [NodeVerdict(node, fence=True) for node in nodes_to_fence(s.state, s.now)]


def judge_attempts(s: Situation) -> list[Proposal]:
    out: list[Proposal] = [AttemptVerdict(job, attempt, reason, timed_out=True)
                           for job, attempt, reason in timed_out_attempts(s.state, s.now)]
    return out + [AttemptVerdict(job, attempt, reason, timed_out=False)
                  for job, attempt, reason in hung_attempts(s.state, s.now, s.supervision)]


def preempt(s: Situation) -> list[Proposal]:
    return list(preemption_decisions(s.state, s.now, s.memory, s.preemption))


def defrag(s: Situation) -> list[Proposal]:
    return list(defrag_decisions(s.state, s.now, s.memory, s.preemption))


def autoscale(s: Situation) -> list[Proposal]:
    out: list[Proposal] = []
    for name, service in s.state.services.items():
        memory = s.scaling.get(name)
        if memory is None:
            memory = s.scaling[name] = ScaleMemory(s.now)
        got = recommend(service, s.loads, memory, s.now)
        if got is not None:
            out.append(ScaleVerdict(name, got.replicas, got.reason))
    for gone in [name for name in s.scaling if name not in s.state.services]:
        del s.scaling[gone]
    return out


# The registry: every action the preemptor can be configured with, by name.
ACTIONS: dict[str, Action] = {a.name: a for a in (
    Action("nodes", judge_nodes, stops=True, help="declare silent nodes lost, fence lost nodes past their fence time"),
    Action("attempts", judge_attempts, stops=False, help="time out attempts past their limit, fail hung attempts"),
    Action("autoscale", autoscale, stops=False, help="scale services to their load (HPA's rule)"),
    Action("preempt", preempt, stops=True, help="victims for pending jobs, by priority or quota reclaim"),
    Action("defrag", defrag, stops=True, help="move checkpointable jobs for jobs blocked by fragmentation only"),
)}
DEFAULT_ACTIONS = ("nodes", "attempts", "autoscale", "preempt", "defrag")


def make_actions(names: Sequence[str]) -> tuple[Action, ...]:
    """The actions named, in order. Raises ``ValueError`` naming unknown or repeated names."""
    if not names:
        raise ValueError(f"no action named (known: {', '.join(ACTIONS)})")
    unknown = [n for n in names if n not in ACTIONS]
    if unknown:
        raise ValueError(f"unknown action {', '.join(map(repr, unknown))} (known: {', '.join(ACTIONS)})")
    repeated = sorted({n for n in names if list(names).count(n) > 1})
    if repeated:
        raise ValueError(f"action {', '.join(map(repr, repeated))} named more than once")
    return tuple(ACTIONS[n] for n in names)


def run_actions(actions: Sequence[Action], situation: Situation) -> list[Proposal]:
    """Every action's proposals, in order, up to the first action that stops and proposed."""
    out: list[Proposal] = []
    for action in actions:
        proposed = action.decide(situation)
        out += proposed
        if proposed and action.stops:
            break
    return out
