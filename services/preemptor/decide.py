"""The preemptor's decisions for one pool, as events. Policy lives in gpusched.policies:
which actions run, in which order, is ``gpusched.policies.actions``."""
from __future__ import annotations

import uuid
from collections import ChainMap
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Mapping, Sequence

from gpusched.adapters.log.gc_pacing import gc_paused
from gpusched.core import events as ev
from gpusched.core.state import ClusterState
from gpusched.policies.actions import (
    DEFAULT_ACTIONS, Action, AttemptVerdict, NodeVerdict, Proposal, ScaleVerdict, Situation, make_actions,
    run_actions,
)
from gpusched.policies.autoscaling import ReplicaLoad, ScaleMemory
from gpusched.policies.queueing.policy_tree import policy_tree
from gpusched.policies.preemption.decisions import preemption_events
from gpusched.policies.memory import CycleMemory
from gpusched.policies.preemption.victim_rules import PreemptionConfig
from gpusched.policies.supervision import SupervisionConfig
from gpusched.policies.preemption.gate import SEARCHES, PossibleVictims, has_guarantees


@dataclass(slots=True)
class PartitionMemory:
    """What the preemptor keeps for one partition between its rounds, dropped whole when
    the partition is revoked (a partition assigned again is replayed into a new state)."""
    possible: PossibleVictims = field(default_factory=PossibleVictims)   # whether a search can propose
    # What the searches keep between rounds: its candidate victims, the placer's views of
    # its nodes, its movable jobs, each brought in step with what changed (``policies.memory``).
    policies: CycleMemory = field(default_factory=CycleMemory)
    # The autoscaler's memory of each service (``policies.autoscaling``).
    scaling: dict[str, ScaleMemory] = field(default_factory=dict)


class PreemptorDecider:
    def __init__(self, me: str, preemption: PreemptionConfig, supervision: SupervisionConfig,
                 heard: Callable[[float], tuple[Mapping[str, float], float, bool]],
                 actions: Sequence[Action] = make_actions(DEFAULT_ACTIONS),
                 loads: Mapping[str, ReplicaLoad] | None = None) -> None:
        self.me = me
        self.preemption = preemption
        self.supervision = supervision
        self.heard = heard          # now -> (last beat per node, listening since, hearing at all)
        self.loads = loads if loads is not None else {}   # replica -> its last measured load
        self.actions = tuple(actions)
        # The actions of a round whose searches can propose nothing (``gate``).
        self.without_searches = tuple(a for a in self.actions if a.name not in SEARCHES)
        # Nodes of the log not heard from yet: when this preemptor first saw them there. A
        # node's beats topic is found by a metadata refresh, which can come after its
        # registration went through the relay: its timeout runs from then, not from ``since``.
        self.unheard: dict[str, float] = {}
        self.memory: dict[int, PartitionMemory] = {}   # what each partition keeps between rounds

    def revoked(self, partitions: Iterable[int]) -> None:
        """Partitions this preemptor no longer owns (its consumer group gave them to
        another): their kept indexes go with them, else each holds a pool's candidate
        victims and free capacity (and the state they read) until the process ends. A
        partition assigned again is replayed into a new state, which an index would
        rebuild from anyway."""
        for partition in partitions:
            self.memory.pop(partition, None)

    def _memory(self, partition: int) -> PartitionMemory:
        memory = self.memory.get(partition)
        if memory is None:
            memory = self.memory[partition] = PartitionMemory()
        return memory

    def _config(self, state: ClusterState) -> PreemptionConfig:
        """The preemption settings with the quotas of the log at this state's position."""
        tree = policy_tree(state, self.preemption.quotas)
        if tree is not self.preemption.quotas:
            return replace(self.preemption, quotas=tree)
        return self.preemption

    def _event(self, cls, now: float, **fields) -> ev.Event:
        return cls(event_id=uuid.uuid4().hex, time=now, producer=self.me, **fields)

    def _with_unheard(self, state: ClusterState, last_seen: Mapping[str, float], now: float) -> Mapping[str, float]:
        for name in [n for n in self.unheard if n in last_seen]:
            del self.unheard[name]
        for name in state.nodes:
            if name not in last_seen:
                self.unheard.setdefault(name, now)
        return ChainMap(last_seen, self.unheard)

    def __call__(self, partition: int, state: ClusterState, now: float) -> list[tuple[ev.Event, str]]:
        # The cyclic GC paused for the round, as the placer's cycle (``gc_pacing``): a round
        # allocates much (the first builds a pool's index of candidate victims), all of which
        # dies by reference count or is kept, and the GC, with the state frozen, would run
        # full collections over the growing index again and again.
        with gc_paused():
            return self._decide(partition, state, now)

    def _decide(self, partition: int, state: ClusterState, now: float) -> list[tuple[ev.Event, str]]:
        last_seen, since, hearing = self.heard(now)
        situation = Situation(state, now, self.supervision, self._config, self._memory(partition).policies,
                              self._with_unheard(state, last_seen, now), since, hearing,
                              self.loads, self._memory(partition).scaling)
        return [out for p in run_actions(self._actions(partition, situation), situation)
                for out in self._events(state, p, now)]

    def _actions(self, partition: int, situation: Situation) -> tuple[Action, ...]:
        possible = self._memory(partition).possible
        if possible.searches_can_propose(situation.state, has_guarantees(situation.preemption.quotas)):
            return self.actions
        return self.without_searches

    def _events(self, state: ClusterState, proposal: Proposal, now: float) -> list[tuple[ev.Event, str]]:
        """A proposal as events, each with the pool whose log it goes to."""
        if isinstance(proposal, NodeVerdict):
            pool = state.nodes[proposal.node].info.pool
            if proposal.fence:
                return [(self._event(ev.NodeFenced, now, node=proposal.node), pool)]
            return [(self._event(ev.NodeLost, now, node=proposal.node, reason=proposal.reason), pool)]
        if isinstance(proposal, AttemptVerdict):
            kind = ev.AttemptTimedOut if proposal.timed_out else ev.AttemptFailed
            event = self._event(kind, now, job_id=proposal.job_id, attempt=proposal.attempt, reason=proposal.reason)
            return [(event, state.jobs[proposal.job_id].spec.pool)]
        if isinstance(proposal, ScaleVerdict):
            event = self._event(ev.ServiceScaled, now, service=proposal.service, replicas=proposal.replicas,
                                reason=proposal.reason)
            return [(event, state.services[proposal.service].spec.pool)]
        pool = state.jobs[proposal.for_job].spec.pool
        return [(e, pool) for e in preemption_events(state, proposal, now, self.me)]
