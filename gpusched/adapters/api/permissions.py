"""Who may do what: roles, the policy file that binds principals to them, and the
per-method permission table every gRPC server checks (``gpusched.adapters.api.auth``).

Roles are Kubernetes-RBAC-like bindings, per team or cluster-wide:

- ``member`` of a team: submit and see that team's jobs, cancel the ones it submitted;
  apply, scale, roll back and delete the team's services; read the cluster.
- ``team-admin`` of a team: the same for any job of the team, plus the team's settings:
  its quota, within its org's (``gpusched.core.policy.team_quota_within_org``).
- ``operator`` (cluster-wide): nodes, pools, quotas/policy, retention, any job.
- ``read-only`` (cluster-wide; billing, dashboards): list/get/watch everything, write nothing.

A permission is a verb on a resource. Team-scoped permissions (``jobs.*``,
``team.settings``) are checked twice: the method's table entry needs the permission for
*some* team (else ``PERMISSION_DENIED`` before the handler runs), then the handler asks
``Access.allows(permission, team)`` for the job's own team and filters reads with
``Access.teams_for``.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

# Permissions.
SUBMIT = "jobs.submit"
CANCEL = "jobs.cancel"                 # the jobs it submitted itself
CANCEL_ANY = "jobs.cancel-any"         # any job of the team
READ_JOBS = "jobs.read"
READ_CLUSTER = "cluster.read"
WRITE_NODES = "nodes.write"
WRITE_POOLS = "pools.write"
WRITE_POLICY = "policy.write"          # quotas, team policy, retention (cluster-wide)
TEAM_SETTINGS = "team.settings"        # a team's own settings: its quota, within its org's
PUBLIC = "public"                      # health checks: no identity needed

TEAM_SCOPED = frozenset({SUBMIT, CANCEL, CANCEL_ANY, READ_JOBS, TEAM_SETTINGS})

ROLES: dict[str, frozenset[str]] = {
    "member": frozenset({SUBMIT, CANCEL, READ_JOBS, READ_CLUSTER}),
    "team-admin": frozenset({SUBMIT, CANCEL, CANCEL_ANY, READ_JOBS, READ_CLUSTER, TEAM_SETTINGS}),
    "operator": frozenset({SUBMIT, CANCEL, CANCEL_ANY, READ_JOBS, READ_CLUSTER, WRITE_NODES, WRITE_POOLS, WRITE_POLICY,
                           TEAM_SETTINGS}),
    "read-only": frozenset({READ_JOBS, READ_CLUSTER}),
}
TEAM_ROLES = frozenset({"member", "team-admin"})
CLUSTER_ROLES = frozenset({"operator", "read-only"})

# Every RPC of every gpusched gRPC service, by full method name. A method missing here
# is denied (fail closed), so a new RPC cannot ship unchecked.
METHODS: dict[str, str] = {
    "/gpusched.v1.AdmissionService/SubmitJob": SUBMIT,
    "/gpusched.v1.AdmissionService/SubmitJobs": SUBMIT,
    "/gpusched.v1.AdmissionService/GetJob": READ_JOBS,
    "/gpusched.v1.AdmissionService/ListJobs": READ_JOBS,
    "/gpusched.v1.AdmissionService/WatchJobs": READ_JOBS,
    "/gpusched.v1.AdmissionService/CancelJob": CANCEL,
    "/gpusched.v1.ServiceApi/ApplyService": SUBMIT,
    "/gpusched.v1.ServiceApi/GetService": READ_JOBS,
    "/gpusched.v1.ServiceApi/ListServices": READ_JOBS,
    "/gpusched.v1.ServiceApi/ScaleService": SUBMIT,
    "/gpusched.v1.ServiceApi/RollbackService": SUBMIT,
    "/gpusched.v1.ServiceApi/DeleteService": SUBMIT,
    "/gpusched.v1.ServiceApi/WatchEndpoints": READ_JOBS,
    "/gpusched.v1.ClusterService/ListNodes": READ_CLUSTER,
    "/gpusched.v1.ClusterService/GetNode": READ_CLUSTER,
    "/gpusched.v1.ClusterService/GetPoolSummary": READ_CLUSTER,
    "/gpusched.v1.ClusterService/CordonNode": WRITE_NODES,
    "/gpusched.v1.ClusterService/UncordonNode": WRITE_NODES,
    "/gpusched.v1.ClusterService/SetPoolTimeLimits": WRITE_POOLS,
    "/gpusched.v1.ClusterService/SetPoolTopology": WRITE_POOLS,
    "/gpusched.v1.ClusterService/CreatePool": WRITE_POOLS,
    "/gpusched.v1.ClusterService/SetQuota": TEAM_SETTINGS,
    "/gpusched.v1.ClusterService/SetTeamPolicy": WRITE_POLICY,
    "/gpusched.v1.ClusterService/GetPolicy": READ_CLUSTER,
    "/gpusched.v1.NodeAgentService/GetInventory": READ_CLUSTER,
    "/gpusched.v1.NodeAgentService/InjectGpuFault": WRITE_NODES,
    "/grpc.health.v1.Health/Check": PUBLIC,
    "/grpc.health.v1.Health/Watch": PUBLIC,
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo": READ_CLUSTER,
}

# A method's permission, and the one that lifts the limit its handler puts on it: a
# member cancels the jobs it submitted, a team admin (``jobs.cancel-any``) any job of its
# team; a team admin sets its own team's quota within its org's, an operator
# (``policy.write``) any quota.
LIFTED_BY = {CANCEL: CANCEL_ANY, TEAM_SETTINGS: WRITE_POLICY}
# What a team role's grant of a team-scoped permission covers (the handlers check it).
TEAM_SCOPES = {SUBMIT: "own teams", CANCEL: "jobs it submitted", CANCEL_ANY: "any job of its teams",
               READ_JOBS: "own teams' jobs", TEAM_SETTINGS: "its team's quota, within its org's"}
CLUSTER_SCOPES = {CANCEL_ANY: "any job", WRITE_POLICY: "any quota"}   # else "any team"
TABLE_ROLES = ("member", "team-admin", "operator", "read-only")


def role_may(role: str, permission: str) -> str:
    """What ``role`` may do of a method that needs ``permission``, as the docs' table
    says it: "no", "yes", "any team", or a team role's scope."""
    if permission == PUBLIC:
        return "yes (no identity needed)"
    granted = ROLES[role]
    lifted = LIFTED_BY.get(permission)
    if lifted in granted:
        return CLUSTER_SCOPES.get(lifted, "any team") if role in CLUSTER_ROLES else TEAM_SCOPES[lifted]
    if permission not in granted:
        return "no"
    if permission not in TEAM_SCOPED:
        return "yes"
    return "any team" if role in CLUSTER_ROLES else TEAM_SCOPES[permission]


def permission_table() -> str:
    """Every RPC with its permission and who may call it, as docs/reference/security.md lists
    them (``python -m gpusched.adapters.api.permissions`` prints it; a test compares)."""
    lines = ["| method | permission | " + " | ".join(TABLE_ROLES) + " |",
             "| --- | --- | " + " | ".join("---" for _ in TABLE_ROLES) + " |"]
    for method, permission in METHODS.items():
        name = method.removeprefix("/").removeprefix("gpusched.v1.")
        needs = f"`{permission}`" + (f" (`{LIFTED_BY[permission]}`)" if permission in LIFTED_BY else "")
        lines.append(f"| `{name}` | {needs} | " + " | ".join(role_may(role, permission) for role in TABLE_ROLES)
                     + " |")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Binding:
    principal: str
    role: str
    team: str = ""      # empty for the cluster-wide roles


class PolicyError(ValueError):
    pass


@dataclass(frozen=True)
class Access:
    """What one principal may do: its role per team, and its cluster-wide roles.
    ``Access.everything`` is the ``--insecure`` dev mode's (no identity, no checks)."""

    principal: str
    team_roles: dict[str, frozenset[str]] = field(default_factory=dict)   # team -> roles
    cluster_roles: frozenset[str] = frozenset()
    unrestricted: bool = False

    @classmethod
    def everything(cls, principal: str = "") -> "Access":
        return cls(principal, unrestricted=True)

    def _cluster_permissions(self) -> frozenset[str]:
        """Granted for every team: the cluster roles' permissions, and the team roles'
        permissions that are not about a team's jobs (reading the cluster)."""
        team_wide = frozenset().union(*(ROLES[r] for roles in self.team_roles.values() for r in roles))
        return frozenset().union(*(ROLES[r] for r in self.cluster_roles)) | (team_wide - TEAM_SCOPED)

    def allows(self, permission: str, team: str | None = None) -> bool:
        """``team=None``: for some team (or cluster-wide); else for that team."""
        if self.unrestricted or permission == PUBLIC or permission in self._cluster_permissions():
            return True
        teams = self.team_roles if team is None else {team: self.team_roles.get(team, frozenset())}
        return any(permission in ROLES[r] for roles in teams.values() for r in roles)

    def teams_for(self, permission: str) -> frozenset[str] | None:
        """The teams it may do this for; None means every team."""
        if self.unrestricted or permission in self._cluster_permissions():
            return None
        return frozenset(t for t, roles in self.team_roles.items() if any(permission in ROLES[r] for r in roles))

    def default_team(self) -> str | None:
        """The team a submission without ``spec.team`` belongs to: the only team it may
        submit for, if exactly one."""
        teams = self.teams_for(SUBMIT)
        return next(iter(teams)) if teams is not None and len(teams) == 1 else None

    def describe(self) -> str:
        roles = [f"{r}@{t}" for t, rs in sorted(self.team_roles.items()) for r in sorted(rs)]
        return ", ".join([*roles, *sorted(self.cluster_roles)]) or "no roles"


class Policy:
    """The principal -> roles bindings of a cluster, from its policy file."""

    def __init__(self, bindings: list[Binding]) -> None:
        self.bindings = bindings
        self._by_principal: dict[str, list[Binding]] = {}
        for b in bindings:
            self._by_principal.setdefault(b.principal, []).append(b)

    def access(self, principal: str) -> Access:
        team_roles: dict[str, set[str]] = {}
        cluster_roles: set[str] = set()
        for b in self._by_principal.get(principal, []):
            if b.team:
                team_roles.setdefault(b.team, set()).add(b.role)
            else:
                cluster_roles.add(b.role)
        return Access(principal, {t: frozenset(r) for t, r in team_roles.items()}, frozenset(cluster_roles))

    @classmethod
    def from_dict(cls, data: object) -> "Policy":
        """``{"bindings": [{"principal": "alice", "role": "member", "team": "nlp"},
        {"principal": "ops", "role": "operator"}, ...]}``; errors name the entry."""
        if not isinstance(data, dict) or not isinstance(data.get("bindings"), list):
            raise PolicyError('bindings: the policy must be an object with a "bindings" list')
        bindings = []
        for i, item in enumerate(data["bindings"]):
            bindings.append(_binding(f"bindings[{i}]", item))
        return cls(bindings)

    @classmethod
    def from_file(cls, path: str | Path) -> "Policy":
        try:
            return cls.from_dict(json.loads(Path(path).read_text()))
        except (OSError, json.JSONDecodeError) as exc:
            raise PolicyError(f"{path}: {exc}") from exc


def _binding(where: str, item: object) -> Binding:
    if not isinstance(item, dict) or set(item) - {"principal", "role", "team"}:
        raise PolicyError(f"{where}: an object with principal, role and (for team roles) team")
    principal, role, team = item.get("principal"), item.get("role"), item.get("team", "")
    if not isinstance(principal, str) or not principal:
        raise PolicyError(f"{where}.principal: must be a non-empty string")
    if role not in ROLES:
        raise PolicyError(f"{where}.role: {role!r} is not one of {sorted(ROLES)}")
    if not isinstance(team, str):
        raise PolicyError(f"{where}.team: must be a string")
    if role in TEAM_ROLES and not team:
        raise PolicyError(f"{where}.team: role {role} is per team: name the team")
    if role in CLUSTER_ROLES and team:
        raise PolicyError(f"{where}.team: role {role} is cluster-wide: leave team out")
    return Binding(principal, role, team)


if __name__ == "__main__":
    print(permission_table(), end="")
