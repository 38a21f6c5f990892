"""Cluster policy as the log holds it: quotas per org and team, and each team's policy
(fair-share weight, the priority classes and pools it may use).

Written by operators through ``ClusterService.SetQuota``/``SetTeamPolicy`` (or bootstrapped
once from a ``--quotas`` file) as ``QuotaSet``/``TeamPolicySet`` events on every partition,
folded by the reducer, carried by snapshots and covered by the digest, so every replica
of every service schedules with the same policy at the same log position.

GPU amounts are milli-GPUs; ``NO_LIMIT`` (-1) means no limit. The team ``DEFAULT_TEAM``
(``"*"``, never a valid team name) holds what applies to teams without an entry of their
own: its quota is the default team quota, its policy the default allow-lists. With no
``"*"`` policy in the log, a team without a policy may use every priority class and pool.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

from gpusched.core.priority import PRIORITY_CLASSES

NO_LIMIT = -1
DEFAULT_TEAM = "*"
MAX_MILLI = 10 ** 12      # a million GPUs: anything above is a typo, not a quota


@dataclass(frozen=True, slots=True)
class Quota:
    """An org's (``team == ""``) or a team's quota, in GPU milli.

    ``borrowing``: whether the team may use more than its guarantee (capacity others
    leave idle); ``lending_limit_milli``: how much of its unused guarantee others may
    borrow (Kueue's lendingLimit; ``NO_LIMIT``: all of it). ``weight`` is an org's
    fair-share weight (a team's is in its ``TeamPolicy``)."""

    org: str
    team: str
    guaranteed_milli: int = 0
    limit_milli: int = NO_LIMIT
    borrowing: bool = True
    lending_limit_milli: int = NO_LIMIT
    weight: float = 1.0


@dataclass(frozen=True, slots=True)
class TeamPolicy:
    """A team's fair-share weight and allow-lists (empty: every class / pool)."""

    team: str
    weight: float = 1.0
    priority_classes: tuple[str, ...] = ()
    pools: tuple[str, ...] = ()


def check_quota(q: Quota) -> str:
    """Why ``q`` cannot be folded, naming the field; "" when it is valid."""
    if q.team == DEFAULT_TEAM and q.org:
        return "org: the default team quota ('*') belongs to no org"
    if not q.team and not q.org:
        return "org: an org quota names its org"
    for name, value in (("guaranteed_milli", q.guaranteed_milli), ("limit_milli", q.limit_milli),
                        ("lending_limit_milli", q.lending_limit_milli)):
        low = 0 if name == "guaranteed_milli" else NO_LIMIT
        if not low <= value <= MAX_MILLI:
            return f"{name}: must be {low}..{MAX_MILLI}, got {value}"
    if q.limit_milli != NO_LIMIT and q.limit_milli < q.guaranteed_milli:
        return f"limit_milli: {q.limit_milli} is below the guarantee {q.guaranteed_milli}"
    if q.lending_limit_milli != NO_LIMIT and q.lending_limit_milli > q.guaranteed_milli:
        return f"lending_limit_milli: {q.lending_limit_milli} is above the guarantee {q.guaranteed_milli}"
    if not (0.0 < q.weight < math.inf):   # NaN fails too
        return f"weight: must be a finite number > 0, got {q.weight}"
    return ""


def check_team_policy(p: TeamPolicy) -> str:
    if not p.team:
        return "team: must not be empty"
    if not (0.0 < p.weight < math.inf):
        return f"weight: must be a finite number > 0, got {p.weight}"
    unknown = [c for c in p.priority_classes if c not in PRIORITY_CLASSES]
    if unknown:
        return f"priority_classes: unknown {unknown}; known: {sorted(PRIORITY_CLASSES)}"
    if len(set(p.priority_classes)) != len(p.priority_classes) or len(set(p.pools)) != len(p.pools):
        return "priority_classes/pools: an entry is repeated"
    if any(not pool for pool in p.pools):
        return "pools: an entry is empty"
    return ""


def allowed(policy: TeamPolicy | None, priority_class: str, pool: str) -> str:
    """The field a job of this class and pool may not use under ``policy``; "" if none."""
    if policy is None:
        return ""
    if policy.priority_classes and priority_class not in policy.priority_classes:
        return "spec.priority_class"
    if policy.pools and pool not in policy.pools:
        return "spec.pool"
    return ""


def team_quota_within_org(quota: Quota, team_quotas: Mapping[str, Quota], org_quotas: Mapping[str, Quota]) -> str:
    """Why a team's own admin may not set its team's quota to ``quota`` (the field named,
    as ``check_quota`` does); "" when it may. As a Kueue or KAI queue admin manages a
    queue within its parent's limits, a team admin manages its team's quota within its
    org's: the team stays in the org the log has it in (moving it is an operator's), the
    org has a quota of its own, the org's teams' guarantees together stay within the
    org's guarantee, and the team's limit within the org's limit. Borrowing and the
    lending limit are the team's to choose (``check_quota`` keeps the latter within its
    guarantee). Everything else about quotas is an operator's."""
    team = quota.team
    if not team or team == DEFAULT_TEAM:
        return "team: only an operator sets an org's quota or the default team's ('*')"
    current = team_quotas.get(team)
    if current is None or not current.org:
        return f"org: team {team!r} belongs to no org in the log: an operator sets its quota"
    if quota.org != current.org:
        return f"org: team {team!r} belongs to org {current.org!r}: an operator moves it"
    org = org_quotas.get(current.org)
    if org is None:
        return f"org: org {current.org!r} has no quota of its own to stay within: an operator sets the team's"
    others = sum(q.guaranteed_milli for q in team_quotas.values() if q.org == current.org and q.team != team)
    if others + quota.guaranteed_milli > org.guaranteed_milli:
        return (f"guaranteed_milli: {_gpus(quota.guaranteed_milli)} GPUs with the {_gpus(others)} of org "
                f"{current.org!r}'s other teams is above the org's guarantee of {_gpus(org.guaranteed_milli)}")
    if org.limit_milli != NO_LIMIT and not 0 <= quota.limit_milli <= org.limit_milli:
        return f"limit_milli: must be set, at most org {current.org!r}'s limit of {_gpus(org.limit_milli)} GPUs"
    return ""


def _gpus(milli: int) -> str:
    return f"{milli / 1000:g}"
