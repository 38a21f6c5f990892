"""The preemptor's decisions for one pool, as events. Policy lives in gpusched.policies."""
from __future__ import annotations

import uuid
from collections import ChainMap
from dataclasses import replace
from typing import Callable, Mapping

from gpusched.core import events as ev
from gpusched.core.state import ClusterState
from gpusched.policies.preemption.defrag import defrag_decisions
from gpusched.policies.queueing.policy_tree import policy_tree
from gpusched.policies.preemption.decisions import preemption_decisions, preemption_events
from gpusched.policies.supervision import (
    SupervisionConfig, hung_attempts, lost_nodes, nodes_to_fence, timed_out_attempts,
)


class PreemptorDecider:
    def __init__(self, me: str, preemption: PreemptionConfig, supervision: SupervisionConfig,
                 heard: Callable[[float], tuple[Mapping[str, float], float, bool]], defrag: bool = True) -> None:
        self.me = me
        self.preemption = preemption
        self.supervision = supervision
        self.heard = heard          # now -> (last beat per node, listening since, hearing at all)
        self.defrag = defrag
        # Nodes of the log not heard from yet: when this preemptor first saw them there. A
        # node's beats topic is found by a metadata refresh, which can come after its
        # registration went through the relay: its timeout runs from then, not from ``since``.
        self.unheard: dict[str, float] = {}

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
        out: list[tuple[ev.Event, str]] = []
        last_seen, since, hearing = self.heard(now)
        last_seen = self._with_unheard(state, last_seen, now)
        for node, reason in (lost_nodes(state, last_seen, since, now, self.supervision) if hearing else []):
            out.append((self._event(ev.NodeLost, now, node=node, reason=reason), state.nodes[node].info.pool))
        for node in nodes_to_fence(state, now):
            out.append((self._event(ev.NodeFenced, now, node=node), state.nodes[node].info.pool))
        if out:
            return out   # let the stops land before judging anything else
        for job_id, attempt, reason in timed_out_attempts(state, now):
            out.append((self._event(ev.AttemptTimedOut, now, job_id=job_id, attempt=attempt, reason=reason),
                        state.jobs[job_id].spec.pool))
        for job_id, attempt, reason in hung_attempts(state, now, self.supervision):
            out.append((self._event(ev.AttemptFailed, now, job_id=job_id, attempt=attempt, reason=reason),
                        state.jobs[job_id].spec.pool))
        config = self._config(state)
        plans = preemption_decisions(state, now, config)
        if self.defrag and not plans:
            plans = defrag_decisions(state, now, config)
        for plan in plans:
            pool = state.jobs[plan.for_job].spec.pool
            out += [(e, pool) for e in preemption_events(state, plan, now, self.me)]
        return out
