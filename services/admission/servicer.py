"""gRPC handlers of AdmissionService (ClusterService's are ``cluster_rpcs``). No policy
here: validation is ``gpusched.core.validation``, state is the log follower's (read
through ``read_model``), writes are events."""
from __future__ import annotations

import asyncio
import base64
import time
import uuid
from collections import Counter
from typing import NamedTuple

import grpc

from gpusched.adapters.api import permissions as perm
from gpusched.adapters.telemetry import tracing
from gpusched.adapters.api.auth import current_access, deny
from gpusched.adapters.log.publisher import EventPublisher
from gpusched.adapters.api.views import job_message
from gpusched.core import events as ev
from gpusched.core.state import JobState
from gpusched.core import validation as limits
from gpusched.core.validation import FieldError, check_time_limit, check_topology, validate_spec
from gpusched.v1 import admission_pb2, admission_pb2_grpc
from gpusched_admission.checks import abort_invalid, check_lengths, check_same_spec, phases_of, pool_errors
from gpusched_admission.convert import api_error, spec_from_request
from gpusched_admission.limits import SubmissionLimits
from gpusched_admission.policy_api import denied_field
from gpusched_admission.read_model import ReadModel
from gpusched_admission.watch import Watchers

_KEY_NAMESPACE = uuid.UUID("6f1c2a8e-0d4b-4d59-9a51-7e2f0c3b9d10")


def job_id_for(team: str, key: str) -> str:
    """Deterministic from the idempotency key, so two replicas racing on the same key
    write the same job id and the reducer keeps only the first."""
    if key:
        return "job-" + uuid.uuid5(_KEY_NAMESPACE, f"{team}/{key}").hex[:20]
    return "job-" + uuid.uuid4().hex[:20]


MAX_BATCH = 1000   # jobs per SubmitJobs call
_SERVICE = "gpusched.v1.AdmissionService"
_API = f"/{_SERVICE}/"   # method names, as denials are counted


class _Denied(NamedTuple):
    """A submission for a team the caller may not act for, or with a priority class or
    pool its team may not use."""

    message: str


class _Submission(NamedTuple):
    """One valid submission: the event to append, or None when its idempotency key
    already names a job."""

    job_id: str
    event: ev.JobSubmitted | None
    pool: str


class AdmissionServicer(admission_pb2_grpc.AdmissionServiceServicer):
    def __init__(self, model: ReadModel, publisher: EventPublisher, producer: str, watchers: Watchers,
                 limits: SubmissionLimits | None = None) -> None:
        self.model = model
        self.publisher = publisher
        self.producer = producer
        self.watchers = watchers
        self.limits = limits or SubmissionLimits()
        self.submitted_here: dict[str, bool | None] = {}   # event id -> accepted?
        self.refusals: dict[str, str] = {}   # event id -> the reducer's reason, for those it rejected

    async def SubmitJob(self, request, context):
        # The job's trace: the caller's, when it sent its context (docs/reference/observability.md).
        with tracing.server_span("SubmitJob", context, _SERVICE) as span:
            await self._fold_unknown_pools([request])
            item = self._prepare(request)
            if isinstance(item, _Denied):
                await deny(context, grpc.StatusCode.PERMISSION_DENIED, _API + "SubmitJob", item.message)
            if isinstance(item, list):
                await abort_invalid(context, item)
            span.set_attribute("gpusched.job_id", item.job_id)
            self._check_limits([item])
            [response] = await self._submit([item], context)
            return response

    async def SubmitJobs(self, request, context):
        with tracing.server_span("SubmitJobs", context, _SERVICE) as span:
            if not request.jobs:
                await abort_invalid(context, [FieldError("jobs", "must not be empty")])
            if len(request.jobs) > MAX_BATCH:
                await abort_invalid(context, [FieldError("jobs", f"at most {MAX_BATCH} per request")])
            span.set_attribute("gpusched.jobs", len(request.jobs))
            await self._fold_unknown_pools(request.jobs)
            items, errors = [], []
            for i, job_request in enumerate(request.jobs):
                item = self._prepare(job_request, f"jobs[{i}].")
                if isinstance(item, _Denied):   # one item denied: nothing is written
                    await deny(context, grpc.StatusCode.PERMISSION_DENIED, _API + "SubmitJobs",
                               f"jobs[{i}]: {item.message}")
                if isinstance(item, list):   # name the item: jobs[3].spec.team
                    errors += [FieldError(f"jobs[{i}].{e.field}", e.message) for e in item]
                else:
                    items.append(item)
            if errors:
                await abort_invalid(context, errors)
            self._check_limits(items)
            # Each new job a trace of its own, linked to this batch's span: one trace per
            # job whether it came alone or in a batch.
            with tracing.batch_item_spans("SubmitJob", [(i.job_id, i.event) for i in items if i.event]):
                return admission_pb2.SubmitJobsResponse(results=await self._submit(items, context))

    def _prepare(self, request, where: str = "") -> _Submission | _Denied | list[FieldError]:
        """A valid request as what to write (or the job its key names); else its errors,
        or its denial. The job's team is the caller's: ``spec.team`` left empty takes the
        caller's only team; a team it may not submit for is denied, and so is a priority
        class or pool the team's policy does not allow (docs/reference/policy.md). ``where``: the
        item's place in a batch, to name its fields ("jobs[3].")."""
        access = current_access()
        team = request.spec.team or access.default_team() or ""
        spec = spec_from_request(request.spec, team)
        if isinstance(spec, FieldError):
            return [spec]
        if spec.team and not access.allows(perm.SUBMIT, spec.team):
            return _Denied(f"principal {access.principal!r} ({access.describe()}) may not submit jobs for team "
                           f"{spec.team!r} (spec.team)")
        errors = validate_spec(spec, self.model.pool_shape(spec.pool))
        errors += pool_errors(spec, self.model.known_pools()) if not errors else []
        errors += check_topology(spec, self.model.pool_levels(spec.pool)) if not errors else []
        errors += check_time_limit(spec, self.model.pool_limits(spec.pool))
        key = request.idempotency_key
        errors += limits.check_length("idempotency_key", key, limits.MAX_KEY)
        if errors:
            return [api_error(e) for e in errors]
        for i, dep in enumerate(spec.depends_on):   # the reducer checks again at the record's place
            other = self.model.job(dep.job)
            if other is None or other.spec.pool != spec.pool:
                return [FieldError(f"{where}spec.depends_on[{i}].job",
                                   f"no job {dep.job!r} in pool {spec.pool!r} (a dependency is in the job's pool)")]
            if other.spec.team != spec.team:
                return _Denied(f"{where}spec.depends_on[{i}].job: job {dep.job!r} belongs to team "
                               f"{other.spec.team!r}, not {spec.team!r}")
        denied = denied_field(self.model.state_for_pool(spec.pool), spec)
        if denied:
            value = spec.priority_class if denied == "spec.priority_class" else spec.pool
            return _Denied(f"{denied}: team {spec.team!r} may not use {value!r} (docs/reference/policy.md)")
        job_id = job_id_for(spec.team, key)
        existing = self.model.job(job_id) if key else None
        if existing is not None:
            check_same_spec(existing, spec, f"{where}idempotency_key")
            return _Submission(job_id, None, spec.pool)
        event = ev.JobSubmitted(event_id=uuid.uuid4().hex, time=time.time(), producer=self.producer,
                                job_id=job_id, spec=spec, idempotency_key=key, principal=access.principal)
        return _Submission(job_id, event, spec.pool)

    async def _fold_unknown_pools(self, requests) -> None:
        """A pool this replica does not know may have just been made (a node registered,
        its agent told ready): fold the log up to its end before refusing the job."""
        known = self.model.known_pools()
        if any((r.spec.pool or "default") not in known for r in requests):
            await self.model.follower.caught_up(timeout=10.0)

    def _check_limits(self, items: list[_Submission]) -> None:
        """The teams' rate and pending limits, for the jobs these items would create."""
        new, jobs = Counter(), Counter()
        for item in items:
            if item.event is not None:
                new[item.event.spec.team] += 1
                jobs[item.event.spec.team] += max(1, item.event.spec.array.count)   # an array: its tasks
        if new:
            self.limits.check(new, self.model.follower.states, jobs)

    async def _submit(self, items: list[_Submission], context) -> list[admission_pb2.SubmitJobResponse]:
        """Append the new jobs' events together (one producer batch), wait until this
        replica has folded them, and answer for each item in order."""
        new = [item for item in items if item.event is not None]
        for item in new:
            self.submitted_here[item.event.event_id] = None
        try:
            if len(new) == 1:   # SubmitJob: no gather, no extra tasks
                await self.model.follower.wait_applied(await self.publisher.publish(new[0].event, new[0].pool))
            elif new:
                positions = await self.publisher.publish_all([(item.event, item.pool) for item in new])
                last = {pos.partition: pos for pos in sorted(positions, key=lambda pos: pos.offset)}
                await asyncio.gather(*(self.model.follower.wait_applied(pos) for pos in last.values()))
        finally:
            accepted = {item.event.event_id: self.submitted_here.pop(item.event.event_id, None) for item in new}
            refused = {item.event.event_id: self.refusals.pop(item.event.event_id, "") for item in new}
        responses = []
        for item in items:
            job = self.model.job(item.job_id)
            if job is None and item.event is not None and refused[item.event.event_id]:
                # The log refused what this replica validated (a pool's limits changed between
                # the check and the fold): its reason names the field.
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, refused[item.event.event_id])
            if job is None:
                await context.abort(grpc.StatusCode.INTERNAL, f"job {item.job_id} not in the log after submit")
            created = item.event is not None and bool(accepted[item.event.event_id])
            if item.event is not None and not created:   # another replica took the key first
                check_same_spec(job, item.event.spec)
            responses.append(admission_pb2.SubmitJobResponse(job=job_message(job), created=created))
        return responses

    def note_outcome(self, event: ev.Event, accepted: bool, reason: str = "") -> None:
        if event.event_id in self.submitted_here:
            self.submitted_here[event.event_id] = accepted
            if not accepted:
                self.refusals[event.event_id] = reason

    async def GetJob(self, request, context):
        if not request.job_id:
            await abort_invalid(context, [FieldError("job_id", "must not be empty")])
        check_lengths(("job_id", request.job_id, limits.MAX_ID))
        job = self.model.job(request.job_id)
        if job is None:
            kept = {state.retention_s for state in self.model.follower.states.values()}
            retention = max(kept, default=0.0)
            kept = f" (finished jobs are kept {retention:g}s after they end)" if retention else ""
            await context.abort(grpc.StatusCode.NOT_FOUND, f"job_id: no job {request.job_id!r}{kept}")
        await _check_team(context, _API + "GetJob", perm.READ_JOBS, job.team, f"see job {job.job_id!r}")
        return job_message(job)

    async def ListJobs(self, request, context):
        size = request.page_size or 100
        if not 1 <= size <= 1000:
            await abort_invalid(context, [FieldError("page_size", "must be 1..1000")])
        check_lengths(("page_token", request.page_token, limits.MAX_PAGE_TOKEN),
                      ("team", request.team, limits.MAX_NAME), ("pool", request.pool, limits.MAX_NAME))
        try:
            after = _decode_token(request.page_token)
        except ValueError:
            await abort_invalid(context, [FieldError("page_token", "not a token from a previous page")])
        phases = phases_of(request.phases, limits.MAX_FILTERS)
        teams = await _readable_teams(context, _API + "ListJobs", request.team)
        matching = sorted(
            (j for j in self.model.jobs()
             if (not request.team or j.team == request.team)
             and (teams is None or j.team in teams)
             and (not request.pool or j.spec.pool == request.pool)
             and (not phases or j.phase in phases)
             and (after is None or (j.submitted_at, j.job_id) > after)),
            key=lambda j: (j.submitted_at, j.job_id),
        )
        page = matching[:size]
        token = _encode_token(page[-1]) if len(matching) > size else ""
        return admission_pb2.ListJobsResponse(jobs=[job_message(j) for j in page], next_page_token=token)

    async def CancelJob(self, request, context):
        check_lengths(("job_id", request.job_id, limits.MAX_ID), ("reason", request.reason, limits.MAX_REASON))
        job = self.model.job(request.job_id) if request.job_id else None
        if job is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"job_id: no job {request.job_id!r}")
        await self._check_cancel(context, job)
        if job.phase.terminal:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"job_id: job already {job.phase.value}")
        event = ev.JobCancelled(event_id=uuid.uuid4().hex, time=time.time(), producer=self.producer,
                                job_id=job.job_id, reason=request.reason or "cancelled by user",
                                principal=current_access().principal)
        pos = await self.publisher.publish(event, job.spec.pool)
        await self.model.follower.wait_applied(pos)
        return job_message(self.model.job(job.job_id))

    async def _check_cancel(self, context, job: JobState) -> None:
        """Any job of a team it may cancel any job of (team-admin, operator); else only
        the jobs it submitted itself (member)."""
        access = current_access()
        if access.allows(perm.CANCEL_ANY, job.team):
            return
        submitter = self.model.submitters.by_job.get(job.job_id)
        if access.allows(perm.CANCEL, job.team) and access.principal and submitter == access.principal:
            return
        own = " (a member cancels only the jobs it submitted)" if access.allows(perm.CANCEL, job.team) else ""
        await deny(context, grpc.StatusCode.PERMISSION_DENIED, _API + "CancelJob",
                   f"principal {access.principal!r} ({access.describe()}) may not cancel job {job.job_id!r} "
                   f"of team {job.team!r}{own}")

    async def WatchJobs(self, request, context):
        # Subscribe first, then send the current state of every matching job, then the
        # changes (Kubernetes' list-then-watch): a client never misses a transition.
        check_lengths(("team", request.team, limits.MAX_NAME), ("job_id", request.job_id, limits.MAX_ID),
                      ("pool", request.pool, limits.MAX_NAME))
        teams = await _readable_teams(context, _API + "WatchJobs", request.team)
        watched = self.model.job(request.job_id) if request.job_id else None
        if watched is not None:   # another team's job: denied as by GetJob, not an empty watch that hangs
            await _check_team(context, _API + "WatchJobs", perm.READ_JOBS, watched.team,
                              f"watch job {watched.job_id!r}")
        queue = self.watchers.subscribe(request.team, request.job_id, request.pool, teams)
        try:
            for job in list(self.model.jobs()):
                if self.watchers.matches(queue, job):
                    yield admission_pb2.JobUpdate(job=job_message(job), event_type="Current", offset=-1)
            while True:
                update = await queue.get()
                if update is None:
                    await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "watcher fell too far behind")
                yield update
        finally:
            self.watchers.unsubscribe(queue)


async def _check_team(context, method: str, permission: str, team: str, what: str) -> None:
    access = current_access()
    if not access.allows(permission, team):
        await deny(context, grpc.StatusCode.PERMISSION_DENIED, method,
                   f"principal {access.principal!r} ({access.describe()}) may not {what} of team {team!r}")


async def _readable_teams(context, method: str, team: str) -> frozenset[str] | None:
    """The teams whose jobs the caller may see (None: all); asking for another is denied."""
    access = current_access()
    teams = access.teams_for(perm.READ_JOBS)
    if team and teams is not None and team not in teams:
        await deny(context, grpc.StatusCode.PERMISSION_DENIED, method,
                   f"principal {access.principal!r} ({access.describe()}) may not see jobs of team {team!r} (team)")
    return teams


def _encode_token(job: JobState) -> str:
    return base64.urlsafe_b64encode(f"{job.submitted_at!r}|{job.job_id}".encode()).decode()


def _decode_token(token: str) -> tuple[float, str] | None:
    if not token:
        return None
    try:
        at, job_id = base64.urlsafe_b64decode(token.encode()).decode().split("|", 1)
        return float(at), job_id
    except Exception as exc:
        raise ValueError(token) from exc
