"""Cluster policy on the operator API (``SetQuota``, ``SetTeamPolicy``, ``GetPolicy``), the
allow-lists at submit, and the ``--quotas`` bootstrap. Admission owns all three: it is
the service that follows every partition, so it writes policy events to each of them
and waits until it folded them before answering."""
from __future__ import annotations

import json
import logging
import math
import time
import uuid
from pathlib import Path

import grpc

from gpusched.adapters.api import permissions as perm
from gpusched.adapters.api.auth import current_access, deny
from gpusched.adapters.log.follower import LogFollower
from gpusched.adapters.log.publisher import EventPublisher
from gpusched.core import events as ev
from gpusched.core.model import JobSpec
from gpusched.core.policy import (
    DEFAULT_TEAM, MAX_MILLI, NO_LIMIT, Quota, TeamPolicy, allowed, check_quota, check_team_policy,
    team_quota_within_org,
)
from gpusched.core.priority import PRIORITY_CLASSES
from gpusched.core.state import ClusterState
from gpusched.policies.queueing.policy_tree import bootstrap_events
from gpusched.v1 import cluster_pb2

log = logging.getLogger("gpusched.admission.policy")

# Reducer reasons name the dataclass fields; the API names its request fields.
_REQUEST_FIELD = {"guaranteed_milli": "guaranteed_gpus", "limit_milli": "limit_gpus",
                  "lending_limit_milli": "lending_limit_gpus"}


def _milli(gpus: float) -> int | None:
    """GPUs as milli-GPUs; None when not a finite amount within range."""
    if not (-1.0 <= gpus * 1000 <= MAX_MILLI) or math.isnan(gpus):
        return None
    return round(gpus * 1000)


def quota_from_request(req) -> Quota | str:
    """The quota a ``SetQuotaRequest`` asks for, or the error naming the field."""
    def opt(name: str, default):
        return getattr(req, name) if req.HasField(name) else default
    amounts = {}
    for name, value in (("guaranteed_gpus", req.guaranteed_gpus), ("limit_gpus", opt("limit_gpus", None)),
                        ("lending_limit_gpus", opt("lending_limit_gpus", None))):
        if value is None:
            amounts[name] = NO_LIMIT
            continue
        milli = _milli(value)
        if milli is None or milli < 0:
            return f"{name}: must be a finite number of GPUs >= 0 (at most {MAX_MILLI // 1000})"
        amounts[name] = milli
    quota = Quota(req.org, req.team, amounts["guaranteed_gpus"], amounts["limit_gpus"], opt("borrowing", True),
                  amounts["lending_limit_gpus"], opt("weight", 1.0))
    if req.team and req.HasField("weight"):
        return "weight: a team's weight is set with SetTeamPolicy (SetQuota's weight is an org's)"
    problem = check_quota(quota)
    return request_problem(problem) if problem else quota


def request_problem(problem: str) -> str:
    """A policy rule's ``field: why`` (``check_quota``'s), naming the request's field."""
    field, _, rest = problem.partition(":")
    return f"{_REQUEST_FIELD.get(field, field)}:{rest}"


def team_policy_from_request(req) -> TeamPolicy | str:
    policy = TeamPolicy(req.team, req.weight if req.HasField("weight") else 1.0,
                        tuple(req.priority_classes), tuple(req.pools))
    return check_team_policy(policy) or policy


def _gpus(milli: int) -> float:
    return -1.0 if milli == NO_LIMIT else milli / 1000


def policy_view(state: ClusterState | None) -> cluster_pb2.PolicyView:
    view = cluster_pb2.PolicyView(priority_classes=sorted(PRIORITY_CLASSES, key=PRIORITY_CLASSES.get,
                                                          reverse=True))
    if state is None:
        return view
    for q in [*sorted(state.org_quotas.values(), key=lambda q: q.org),
              *sorted(state.team_quotas.values(), key=lambda q: q.team)]:
        view.quotas.add(org=q.org, team=q.team, guaranteed_gpus=q.guaranteed_milli / 1000,
                        limit_gpus=_gpus(q.limit_milli), borrowing=q.borrowing,
                        lending_limit_gpus=_gpus(q.lending_limit_milli), weight=q.weight)
    for p in sorted(state.team_policies.values(), key=lambda p: p.team):
        view.team_policies.add(team=p.team, weight=p.weight, priority_classes=p.priority_classes, pools=p.pools)
    return view


def denied_field(state: ClusterState | None, spec: JobSpec) -> str:
    """The field of ``spec`` its team may not use (``spec.priority_class`` or
    ``spec.pool``); "" when allowed. A team without a policy of its own has the default
    team's ('*'); with neither, it may use everything."""
    if state is None:
        return ""
    policies = state.team_policies
    return allowed(policies.get(spec.team) or policies.get(DEFAULT_TEAM), spec.priority_class, spec.pool)


async def write_everywhere(follower: LogFollower, publisher: EventPublisher, partitions: int,
                           make) -> None:
    """Append ``make()`` (a fresh event) to every partition and wait until each is folded."""
    for partition in range(partitions):
        await follower.wait_applied(await publisher.publish_to(make(), partition))


class PolicyRpcs:
    """``ClusterService``'s policy RPCs; mixed into ``ClusterServicer`` (model, publisher, producer)."""

    async def SetQuota(self, request, context):
        quota = quota_from_request(request)
        if isinstance(quota, str):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, quota)
        await self._check_may_set(context, quota)
        return await self._write_policy(lambda: ev.QuotaSet(
            event_id=uuid.uuid4().hex, time=time.time(), producer=self.producer, quota=quota,
            principal=current_access().principal))

    async def _check_may_set(self, context, quota: Quota) -> None:
        """An operator sets any quota; a team admin its own team's, within its org's
        (``team_quota_within_org``, on the policy the log holds now)."""
        access = current_access()
        if access.allows(perm.WRITE_POLICY):
            return
        who = f"principal {access.principal!r} ({access.describe()})"
        method = "/gpusched.v1.ClusterService/SetQuota"
        if not quota.team or not access.allows(perm.TEAM_SETTINGS, quota.team):
            what = f"team {quota.team!r}'s quota" if quota.team else f"org {quota.org!r}'s quota"
            await deny(context, grpc.StatusCode.PERMISSION_DENIED, method,
                       f"team: {who} may not set {what}: a team admin sets its own team's")
        state = self.model.follower.states.get(0)
        problem = team_quota_within_org(quota, state.team_quotas if state else {}, state.org_quotas if state else {})
        if problem:
            await deny(context, grpc.StatusCode.PERMISSION_DENIED, method,
                       f"{request_problem(problem)} ({who}: a team admin stays within its org's quota)")

    async def SetTeamPolicy(self, request, context):
        policy = team_policy_from_request(request)
        if isinstance(policy, str):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, policy)
        return await self._write_policy(lambda: ev.TeamPolicySet(
            event_id=uuid.uuid4().hex, time=time.time(), producer=self.producer, policy=policy,
            principal=current_access().principal))

    async def GetPolicy(self, request, context):
        return policy_view(self.model.follower.states.get(0))

    async def _write_policy(self, make):
        await write_everywhere(self.model.follower, self.publisher, self.model.partitions, make)
        return policy_view(self.model.follower.states.get(0))


async def bootstrap_policy(follower: LogFollower, publisher: EventPublisher, me: str, partitions: int,
                           path: str) -> None:
    """Write the ``--quotas`` file (``QueueTree.from_dict`` JSON) into each partition whose
    log holds no policy yet, and wait until it is folded. A log that holds a policy keeps
    it: the file is a bootstrap, the log (changed through the API) is the truth."""
    if not path:
        return
    try:
        data = json.loads(Path(path).read_text())
        bootstrap_events(data, me, 0.0, 0)   # validate before writing anything
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        raise SystemExit(f"--quotas {path}: {exc}")
    for partition in range(partitions):
        state = follower.states.get(partition)
        if state is not None and state.policy_version:
            continue
        log.info("bootstrapping the cluster policy of partition %d from %s", partition, path)
        for event in bootstrap_events(data, me, time.time(), partition):
            pos = await publisher.publish_to(event, partition)
        await follower.wait_applied(pos)
