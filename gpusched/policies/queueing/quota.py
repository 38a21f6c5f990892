"""Hierarchical GPU quotas (org -> team): a guarantee, a limit and a weight at each level.

A team's *guarantee* is GPU capacity it gets ahead of any borrower; capacity another team
leaves idle may be *borrowed* up to the borrower's *limit*, which placement never exceeds.
The *weight* scales a team's fair share among borrowers (weighted DRF, ``fairshare``).
A team that does not *borrow* never goes above its guarantee; a team's *lending limit*
bounds how much of its unused guarantee others may borrow (the rest stays free for it).

Accounting is by team name (``ClusterState.usage`` is keyed by team), so team names are
unique across orgs; a team belongs to the org that lists it. Teams the tree does not list
share the unnamed org ``""`` with ``QueueTree.default_team`` as their quota. Quotas count
GPU milli only; CPU and memory enter fair share through DRF, not through quotas.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from gpusched.core.state import ClusterState, JobState

UNLIMITED = math.inf


def _milli(gpus: float | None) -> float:
    return UNLIMITED if gpus is None else round(gpus * 1000)


@dataclass(frozen=True, slots=True)
class TeamQuota:
    guaranteed_gpus: float = 0.0
    limit_gpus: float | None = None     # None: no limit below the cluster's size
    weight: float = 1.0
    borrowing: bool = True              # False: never above its guarantee
    lending_limit_gpus: float | None = None   # of its unused guarantee, what others may borrow

    def __post_init__(self) -> None:
        _check(self.guaranteed_gpus, self.limit_gpus, self.weight)

    @property
    def guaranteed_milli(self) -> float:
        return _milli(self.guaranteed_gpus)

    @property
    def limit_milli(self) -> float:
        limit = _milli(self.limit_gpus)
        return limit if self.borrowing else min(limit, self.guaranteed_milli)


@dataclass(frozen=True, slots=True)
class OrgQuota:
    teams: Mapping[str, TeamQuota] = field(default_factory=dict)
    guaranteed_gpus: float | None = None   # None: the sum of its teams' guarantees
    limit_gpus: float | None = None
    weight: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "teams", dict(self.teams))   # a copy: the caller keeps theirs
        _check(self.guaranteed_gpus or 0.0, self.limit_gpus, self.weight)

    @property
    def guaranteed_milli(self) -> float:
        if self.guaranteed_gpus is None:
            return sum(t.guaranteed_milli for t in self.teams.values())
        return _milli(self.guaranteed_gpus)

    @property
    def limit_milli(self) -> float:
        return _milli(self.limit_gpus)


def _check(guaranteed: float, limit: float | None, weight: float) -> None:
    if guaranteed < 0 or weight <= 0 or (limit is not None and limit < guaranteed):
        raise ValueError(f"bad quota: guaranteed={guaranteed} limit={limit} weight={weight}")


NO_ORG = OrgQuota()


@dataclass(frozen=True, slots=True)
class QueueTree:
    orgs: Mapping[str, OrgQuota] = field(default_factory=dict)
    default_team: TeamQuota = TeamQuota()
    _org_of: Mapping[str, str] = field(init=False, repr=False, compare=False)
    _has_limits: bool = field(init=False, repr=False, compare=False)
    _lenders: tuple[tuple[str, float, float], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "orgs", dict(self.orgs))
        org_of: dict[str, str] = {}
        for org, quota in self.orgs.items():
            for team in quota.teams:
                if team in org_of:
                    raise ValueError(f"team {team!r} listed in orgs {org_of[team]!r} and {org!r}")
                org_of[team] = org
        object.__setattr__(self, "_org_of", org_of)
        limits = [self.default_team.limit_gpus] + [o.limit_gpus for o in self.orgs.values()] + [
            t.limit_gpus for o in self.orgs.values() for t in o.teams.values()]
        no_borrowing = not self.default_team.borrowing or any(
            not t.borrowing for o in self.orgs.values() for t in o.teams.values())
        object.__setattr__(self, "_has_limits", no_borrowing or any(limit is not None for limit in limits))
        # Listed teams that lend only part of their unused guarantee: (team, guarantee, lending limit).
        object.__setattr__(self, "_lenders", tuple(
            (t, q.guaranteed_milli, _milli(q.lending_limit_gpus))
            for o in self.orgs.values() for t, q in o.teams.items() if q.lending_limit_gpus is not None))

    def org_of(self, team: str) -> str:
        return self._org_of.get(team, "")

    def team_quota(self, team: str) -> TeamQuota:
        org = self.orgs.get(self.org_of(team))
        return org.teams[team] if org is not None and team in org.teams else self.default_team

    def org_quota(self, org: str) -> OrgQuota:
        return self.orgs.get(org, NO_ORG)

    def teams_of(self, org: str) -> tuple[str, ...]:
        return tuple(self.org_quota(org).teams)

    def teams(self) -> tuple[str, ...]:
        return tuple(self._org_of)

    @property
    def has_limits(self) -> bool:
        return self._has_limits or bool(self._lenders)

    @property
    def has_guarantees(self) -> bool:
        """Whether any team has a guarantee (the default team's counts for every unlisted one)."""
        return bool(self.default_team.guaranteed_gpus) or any(
            t.guaranteed_gpus for o in self.orgs.values() for t in o.teams.values())

    @property
    def lenders(self) -> tuple[tuple[str, float, float], ...]:
        return self._lenders

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> QueueTree:
        """``{"orgs": {org: {"guaranteed_gpus", "limit_gpus", "weight", "teams": {team:
        {"guaranteed_gpus", "limit_gpus", "weight"}}}}, "default_team": {...}}``."""
        orgs = {}
        for org, spec in data.get("orgs", {}).items():
            spec = dict(spec)
            teams = {t: TeamQuota(**q) for t, q in spec.pop("teams", {}).items()}
            orgs[org] = OrgQuota(teams=teams, **spec)
        return cls(orgs=orgs, default_team=TeamQuota(**data.get("default_team", {})))

    @classmethod
    def from_json(cls, text: str) -> QueueTree:
        return cls.from_dict(json.loads(text))

    def to_dict(self) -> dict[str, Any]:
        def quota(q: TeamQuota) -> dict[str, Any]:
            return {"guaranteed_gpus": q.guaranteed_gpus, "limit_gpus": q.limit_gpus, "weight": q.weight,
                    "borrowing": q.borrowing, "lending_limit_gpus": q.lending_limit_gpus}
        return {
            "orgs": {
                org: {"guaranteed_gpus": o.guaranteed_gpus, "limit_gpus": o.limit_gpus,
                      "weight": o.weight, "teams": {t: quota(q) for t, q in o.teams.items()}}
                for org, o in self.orgs.items()
            },
            "default_team": quota(self.default_team),
        }


# --- who borrows --------------------------------------------------------------------------
def claims_guarantee(held_milli: float, job_milli: float, guaranteed_milli: float) -> bool:
    """Whether a job of ``job_milli`` is claimed against its holder's guarantee (rather than
    borrowed) when the holder (a team, or an org) holds ``held_milli``: it fits within the
    guarantee, or the holder is below its guarantee and the job crosses it. A job that
    crosses its team's guarantee is not a borrower's for the part below it: were it ranked
    as one, the free GPUs it waits for would go to another team's borrower and be reclaimed
    back. The one rule the cycle's fair-share tiers, the guarantee hold and the
    preemptor's reclaim ask (so they agree on who is borrowing)."""
    return held_milli < guaranteed_milli or held_milli + job_milli <= guaranteed_milli


# --- accounting -----------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class TeamAccount:
    team: str
    org: str
    guaranteed_milli: float
    limit_milli: float
    used_milli: int

    @property
    def borrowed_milli(self) -> float:
        """What the team holds beyond its guarantee: capacity lent by others."""
        return max(0.0, self.used_milli - self.guaranteed_milli)

    @property
    def unused_guarantee_milli(self) -> float:
        """Guaranteed capacity the team does not use: what borrowers must give back."""
        return max(0.0, self.guaranteed_milli - self.used_milli)


def team_accounts(state: ClusterState, tree: QueueTree) -> dict[str, TeamAccount]:
    """Per team: guaranteed, used and borrowed GPU milli, for every team the tree lists
    or that holds (or held) GPUs."""
    teams = sorted(set(tree.teams()) | set(state.usage))
    accounts = {}
    for team in teams:
        quota = tree.team_quota(team)
        used = state.usage[team].gpu_milli if team in state.usage else 0
        accounts[team] = TeamAccount(team, tree.org_of(team), quota.guaranteed_milli,
                                     quota.limit_milli, used)
    return accounts


def org_used_milli(state: ClusterState, tree: QueueTree, org: str) -> int:
    if not org:
        return 0   # the unnamed org has no quota; nothing needs its total
    usage = state.usage
    return sum(usage[t].gpu_milli for t in tree.teams_of(org) if t in usage)


def within_limits(state: ClusterState, tree: QueueTree, job: JobState,
                  reserved: JobState | None = None) -> bool:
    """Whether placing ``job`` now keeps its team and org within their limits, counting
    the GPUs already booked in ``state`` and those ``reserved`` for a head-of-line job."""
    return not tree.has_limits or not limit_reached(state, tree, job, reserved)


def limit_reached(state: ClusterState, tree: QueueTree, job: JobState,
                  reserved: JobState | None = None) -> str:
    """Which limit placing ``job`` now would break, in words ("" when none): the one
    quota rule, which ``within_limits`` asks and the pending reason quotes."""
    if not tree.has_limits:
        return ""
    team = job.team
    org = tree.org_of(team)
    team_used = state.usage[team].gpu_milli if team in state.usage else 0
    org_used = org_used_milli(state, tree, org)
    if reserved is not None and reserved.job_id != job.job_id:
        if reserved.team == team:
            team_used += reserved.milli
        if org and tree.org_of(reserved.team) == org:
            org_used += reserved.milli
    quota = tree.team_quota(team)
    if team_used + job.milli > quota.limit_milli:
        return _over("team", team, team_used, job.milli, quota.limit_milli)
    if org and org_used + job.milli > tree.org_quota(org).limit_milli:
        return _over("org", org, org_used, job.milli, tree.org_quota(org).limit_milli)
    if tree.lenders and team_used + job.milli > quota.guaranteed_milli \
            and not _lending_allows(state, tree, job, reserved):
        return (f"team {team} would borrow GPUs that other teams' guarantees keep back "
                f"(their lending limits)")
    return ""


def _over(level: str, name: str, used: float, asked: int, limit: float) -> str:
    return (f"{level} {name} would go over its GPU limit: {used / 1000:g} in use + {asked / 1000:g} asked "
            f"> {limit / 1000:g}")


def _lending_allows(state: ClusterState, tree: QueueTree, job: JobState, reserved: JobState | None) -> bool:
    """A borrowing placement must leave free what lenders keep back: of each listed team's
    unused guarantee, the part above its lending limit (Kueue's lendingLimit)."""
    usage = state.usage
    kept_back = 0.0
    for team, guaranteed, lending in tree.lenders:
        if team != job.team:
            used = usage[team].gpu_milli if team in usage else 0
            kept_back += max(0.0, max(0.0, guaranteed - used) - lending)
    if not kept_back:
        return True
    capacity = sum(1000 * sum(1 for g in n.gpus if g.healthy) for n in state.nodes.values() if n.schedulable)
    used_all = sum(u.gpu_milli for u in usage.values())
    if reserved is not None and reserved.job_id != job.job_id:
        used_all += reserved.milli
    return capacity - used_all - job.milli >= kept_back
