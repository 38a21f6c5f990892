"""The quota tree of a folded state, and the quota events a bootstrap file stands for.

Schedulers read quotas and weights from the state of the partition they schedule
(``ClusterState.org_quotas``/``team_quotas``/``team_policies``, folded from the log), so a
change takes effect in the placer and the preemptor at the same log position. A state
whose log holds no policy yields ``None``: the caller's own tree applies (the simulator's
and the benchmarks' ``SchedulerConfig.quotas``; an empty tree in the services).
"""
from __future__ import annotations

import uuid
from typing import Any, Mapping

from gpusched.core import events as ev
from gpusched.core.policy import DEFAULT_TEAM, NO_LIMIT, Quota, TeamPolicy
from gpusched.core.state import ClusterState
from gpusched.policies.queueing.quota import OrgQuota, QueueTree, TeamQuota

_TREES: dict[int, tuple[ClusterState, int, QueueTree]] = {}   # id(state) -> (state, policy_version, tree)


def _gpus(milli: int) -> float | None:
    return None if milli == NO_LIMIT else milli / 1000


def _team(q: Quota | None, weight: float) -> TeamQuota:
    if q is None:
        return TeamQuota(weight=weight)
    return TeamQuota(q.guaranteed_milli / 1000, _gpus(q.limit_milli), weight, q.borrowing,
                     _gpus(q.lending_limit_milli))


def tree_of(state: ClusterState) -> QueueTree:
    """The tree the log's policy describes (built once per policy change)."""
    kept = _TREES.get(id(state))
    if kept is not None and kept[0] is state and kept[1] == state.policy_version:
        return kept[2]
    if len(_TREES) > 64:   # states of partitions long gone
        _TREES.clear()
    tree = _build(state)
    _TREES[id(state)] = (state, state.policy_version, tree)
    return tree


def _build(state: ClusterState) -> QueueTree:
    policies = state.team_policies
    default_weight = policies[DEFAULT_TEAM].weight if DEFAULT_TEAM in policies else 1.0
    teams: dict[str, dict[str, TeamQuota]] = {org: {} for org in state.org_quotas}
    for team, q in state.team_quotas.items():
        if team != DEFAULT_TEAM:
            weight = policies[team].weight if team in policies else default_weight
            teams.setdefault(q.org, {})[team] = _team(q, weight)
    default = _team(state.team_quotas.get(DEFAULT_TEAM), default_weight)
    for team, p in policies.items():
        # A weight without a quota: the team takes the default quota with its own weight.
        if team != DEFAULT_TEAM and team not in state.team_quotas:
            teams.setdefault("", {})[team] = TeamQuota(default.guaranteed_gpus, default.limit_gpus, p.weight,
                                                        default.borrowing, default.lending_limit_gpus)
    orgs = {}
    for org, members in teams.items():
        oq = state.org_quotas.get(org)
        orgs[org] = OrgQuota(members) if oq is None else OrgQuota(
            members, oq.guaranteed_milli / 1000, _gpus(oq.limit_milli), oq.weight)
    return QueueTree(orgs, default)


def policy_tree(state: ClusterState, fallback: QueueTree) -> QueueTree:
    """The log's tree once the log holds a policy; ``fallback`` before."""
    return tree_of(state) if state.policy_version else fallback


# --- bootstrap: a QueueTree file as events -----------------------------------------------
def _milli(gpus: float | None) -> int:
    return NO_LIMIT if gpus is None else round(gpus * 1000)


def bootstrap_events(data: Mapping[str, Any], producer: str, time: float, partition: int) -> list[ev.Event]:
    """The events that set a ``QueueTree.from_dict`` document's quotas and weights. Their
    ids derive from the document and the partition, so two services bootstrapping the
    same file at once write duplicates the reducer drops."""
    tree = QueueTree.from_dict(data)   # validates (ValueError/TypeError on a bad file)
    seed = f"{sorted(tree.to_dict().items())!r}/{partition}"
    out: list[ev.Event] = []

    def add(cls, **fields) -> None:
        eid = uuid.uuid5(uuid.NAMESPACE_URL, f"gpusched-bootstrap/{seed}/{len(out)}").hex
        out.append(cls(event_id=eid, time=time, producer=producer, **fields))

    def team(org: str, name: str, q: TeamQuota) -> None:
        add(ev.QuotaSet, quota=Quota(org, name, _milli(q.guaranteed_gpus), _milli(q.limit_gpus), q.borrowing,
                                     _milli(q.lending_limit_gpus)))
        add(ev.TeamPolicySet, policy=TeamPolicy(name, q.weight))

    for org, oq in tree.orgs.items():
        if org and (oq.guaranteed_gpus is not None or oq.limit_gpus is not None or oq.weight != 1.0):
            # An org without a guarantee of its own has the sum of its teams' (OrgQuota):
            # written out, it is that sum as the file states it.
            guaranteed = oq.guaranteed_milli
            add(ev.QuotaSet, quota=Quota(org, "", int(guaranteed), _milli(oq.limit_gpus), True, NO_LIMIT, oq.weight))
        for name, q in oq.teams.items():
            team(org, name, q)
    team("", DEFAULT_TEAM, tree.default_team)
    return out
