"""gRPC handlers of ServiceApi: long-running services (replicas of a template). As for
jobs, no policy here: the spec's rules are ``gpusched.core.validation.check_service_alone``
and the pool's (``validate_spec`` on the replica spec), the state is the follower's, and a
write is an event in the pool's log, answered once this replica has folded it."""
from __future__ import annotations

import asyncio
import time
from dataclasses import replace
import uuid
from typing import Callable

import grpc

from gpusched.adapters.api import permissions as perm
from gpusched.adapters.api.auth import current_access, deny
from gpusched.adapters.api.views import endpoints_of, service_message
from gpusched.adapters.log.publisher import EventPublisher, partition_for
from gpusched.core import events as ev
from gpusched.core import validation as limits
from gpusched.core.state import ClusterState, ServiceState
from gpusched.core.validation import (
    FieldError, check_scale, check_service_alone, check_time_limit, check_topology, validate_spec,
)
from gpusched.v1 import admission_pb2, admission_pb2_grpc
from gpusched_admission.checks import abort_invalid, check_lengths, pool_errors
from gpusched_admission.convert import api_error, service_from_request, template_error
from gpusched_admission.policy_api import denied_field
from gpusched_admission.read_model import ReadModel

_API = "/gpusched.v1.ServiceApi/"
QUEUE_BOUND = 1000


class EndpointWatchers:
    """WatchEndpoints streams: after each accepted event of a partition, the ready list of
    each watched service of it, sent when it differs from the last one sent."""

    def __init__(self) -> None:
        self._watched: dict[asyncio.Queue, tuple[str, int]] = {}   # queue -> (service, partition)
        self.last: dict[asyncio.Queue, list] = {}

    def subscribe(self, name: str, partition: int) -> asyncio.Queue:
        queue: asyncio.Queue = asyncio.Queue(QUEUE_BOUND)
        self._watched[queue] = (name, partition)
        return queue

    def unsubscribe(self, queue: asyncio.Queue) -> None:
        self._watched.pop(queue, None)
        self.last.pop(queue, None)

    def on_event(self, partition: int, offset: int, state: ClusterState) -> None:
        for queue, (name, watched) in list(self._watched.items()):
            if watched != partition:
                continue
            service = state.services.get(name)
            if service is None:
                self._put(queue, admission_pb2.Endpoints(service=name, offset=offset, deleted=True))
                self.unsubscribe(queue)
                continue
            now = endpoints_of(service)
            if now != self.last.get(queue):
                self.last[queue] = now
                self._put(queue, endpoints_message(name, now, offset))

    def _put(self, queue: asyncio.Queue, message) -> None:
        if queue.full():   # a stalled client: its stream ends rather than memory growing
            self.unsubscribe(queue)
            queue.get_nowait()
            message = None
        queue.put_nowait(message)


def endpoints_message(name: str, endpoints: list, offset: int) -> admission_pb2.Endpoints:
    return admission_pb2.Endpoints(service=name, offset=offset, endpoints=[
        admission_pb2.Endpoint(replica=r, address=a, port=p, revision=v) for r, a, p, v in endpoints])


class ServiceApiServicer(admission_pb2_grpc.ServiceApiServicer):
    def __init__(self, model: ReadModel, publisher: EventPublisher, producer: str, watchers: EndpointWatchers,
                 clock: Callable[[], float] = time.time) -> None:
        self.model = model
        self.publisher = publisher
        self.producer = producer
        self.watchers = watchers
        self.clock = clock
        self.written: dict[str, str | None] = {}   # event id -> None until folded, then the refusal ("" accepted)

    def note_outcome(self, event: ev.Event, accepted: bool, reason: str = "") -> None:
        if event.event_id in self.written:
            self.written[event.event_id] = "" if accepted else (reason or "refused")

    # --- writes ------------------------------------------------------------------------
    async def ApplyService(self, request, context):
        access = current_access()
        spec = service_from_request(request.spec, access.default_team() or "")
        if isinstance(spec, FieldError):
            await abort_invalid(context, [spec])
        if spec.team and not access.allows(perm.SUBMIT, spec.team):
            await deny(context, grpc.StatusCode.PERMISSION_DENIED, _API + "ApplyService",
                       f"spec.team: principal {access.principal!r} ({access.describe()}) may not apply services "
                       f"for team {spec.team!r}")
        if spec.pool not in self.model.known_pools():   # a pool just made: fold the log's end first
            await self.model.follower.caught_up(timeout=10.0)
        errors = check_service_alone(spec)
        if not errors:
            replica = spec.replica_spec()
            errors = [template_error(e) for e in validate_spec(replica, self.model.pool_shape(spec.pool))]
            errors += pool_errors(replica, self.model.known_pools()) if not errors else []
            if not errors:
                errors = [template_error(e) for e in check_topology(replica, self.model.pool_levels(spec.pool))]
            errors += [template_error(e) for e in check_time_limit(replica, self.model.pool_limits(spec.pool))]
        if errors:
            await abort_invalid(context, [_api_field(e) for e in errors])
        existing = self.model.service(spec.name)
        if existing is not None:
            old = existing[0].spec
            await self._check_team(context, "ApplyService", old.team, f"change service {old.name!r}",
                                   field="spec.name")
            if (old.team, old.pool) != (spec.team, spec.pool):
                await abort_invalid(context, [FieldError("spec.pool" if old.team == spec.team else "spec.team",
                                                         f"service {old.name!r} is team {old.team!r}'s in pool "
                                                         f"{old.pool!r}; delete it to move it")])
        denied = denied_field(self.model.state_for_pool(spec.pool), spec.replica_spec())
        if denied:
            value = spec.priority_class if denied == "spec.priority_class" else spec.pool
            await deny(context, grpc.StatusCode.PERMISSION_DENIED, _API + "ApplyService",
                       f"{denied}: team {spec.team!r} may not use {value!r} (docs/reference/policy.md)")
        await self._write(context, ev.ServiceApplied(**self._meta(), spec=spec, principal=access.principal), spec.pool)
        return await self._view(context, spec.name)

    async def ScaleService(self, request, context):
        check_lengths(("reason", request.reason, limits.MAX_REASON))
        service, _ = await self._own(context, request.name, "ScaleService", "scale")
        spec = service.spec
        errors = check_scale(spec, request.replicas)
        if errors:
            await abort_invalid(context, errors)
        await self._write(context, ev.ServiceScaled(**self._meta(), service=spec.name, replicas=request.replicas,
                                                    reason=request.reason or "scaled by user",
                                                    principal=current_access().principal), spec.pool)
        return await self._view(context, spec.name)

    async def RollbackService(self, request, context):
        service, _ = await self._own(context, request.name, "RollbackService", "roll back")
        earlier = sorted(r for r in service.templates if r != service.revision)
        revision = request.revision or (earlier[-1] if earlier else 0)
        if revision == service.revision or revision not in service.templates:
            asked = f" {request.revision}" if request.revision else ""
            await abort_invalid(context, [FieldError("revision", f"no earlier revision{asked} of service "
                                                                 f"{service.spec.name!r} is kept (kept: "
                                                                 f"{', '.join(map(str, earlier)) or 'none'})")])
        spec = service.spec
        rolled = replace(spec, template=_as_template(service.templates[revision], spec.template))
        await self._write(context, ev.ServiceApplied(**self._meta(), spec=rolled,
                                                     principal=current_access().principal), spec.pool)
        return await self._view(context, spec.name)

    async def DeleteService(self, request, context):
        service, state = await self._own(context, request.name, "DeleteService", "delete")
        before = service_message(service, state, self.clock())
        await self._write(context, ev.ServiceDeleted(**self._meta(), service=service.spec.name,
                                                     principal=current_access().principal), service.spec.pool)
        return admission_pb2.DeleteServiceResponse(service=before)

    # --- reads -------------------------------------------------------------------------
    async def GetService(self, request, context):
        service, state = await self._find(context, request.name)
        await self._check_team(context, "GetService", service.spec.team, f"see service {service.spec.name!r}",
                               perm.READ_JOBS)
        return service_message(service, state, self.clock())

    async def ListServices(self, request, context):
        check_lengths(("team", request.team, limits.MAX_NAME), ("pool", request.pool, limits.MAX_NAME))
        access = current_access()
        teams = access.teams_for(perm.READ_JOBS)
        if request.team and teams is not None and request.team not in teams:
            await deny(context, grpc.StatusCode.PERMISSION_DENIED, _API + "ListServices",
                       f"team: principal {access.principal!r} ({access.describe()}) may not see services of team "
                       f"{request.team!r}")
        now = self.clock()
        found = sorted(((s, st) for s, st in self.model.services()
                        if (not request.team or s.spec.team == request.team)
                        and (not request.pool or s.spec.pool == request.pool)
                        and (teams is None or s.spec.team in teams)), key=lambda pair: pair[0].spec.name)
        return admission_pb2.ListServicesResponse(services=[service_message(s, st, now) for s, st in found])

    async def WatchEndpoints(self, request, context):
        service, _ = await self._find(context, request.name)
        await self._check_team(context, "WatchEndpoints", service.spec.team, f"watch service {service.spec.name!r}",
                               perm.READ_JOBS)
        partition = partition_for(service.spec.pool, self.model.partitions)
        queue = self.watchers.subscribe(service.spec.name, partition)   # first, then the current list
        try:
            now = endpoints_of(service)
            self.watchers.last[queue] = now
            yield endpoints_message(service.spec.name, now, -1)
            while True:
                update = await queue.get()
                if update is None:
                    await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "watcher fell too far behind")
                yield update
                if update.deleted:
                    return
        finally:
            self.watchers.unsubscribe(queue)

    # --- shared ------------------------------------------------------------------------
    def _meta(self) -> dict:
        return {"event_id": uuid.uuid4().hex, "time": time.time(), "producer": self.producer}

    async def _write(self, context, event: ev.Event, pool: str) -> None:
        """Append ``event`` to the pool's log and wait until this replica folded it; the
        log's refusal (a race with another write) is FAILED_PRECONDITION with its reason."""
        self.written[event.event_id] = None
        try:
            await self.model.follower.wait_applied(await self.publisher.publish(event, pool))
        finally:
            refused = self.written.pop(event.event_id, None)
        if refused:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, refused)

    async def _view(self, context, name: str):
        found = self.model.service(name)
        if found is None:
            await context.abort(grpc.StatusCode.INTERNAL, f"service {name} not in the log after the write")
        return service_message(found[0], found[1], self.clock())

    async def _find(self, context, name: str) -> tuple[ServiceState, ClusterState]:
        check_lengths(("name", name, limits.MAX_NAME))
        found = self.model.service(name) if name else None
        if found is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"name: no service {name!r}")
        return found

    async def _own(self, context, name: str, method: str, verb: str) -> tuple[ServiceState, ClusterState]:
        service, state = await self._find(context, name)
        await self._check_team(context, method, service.spec.team, f"{verb} service {name!r}")
        return service, state

    async def _check_team(self, context, method: str, team: str, what: str, permission: str = perm.SUBMIT,
                          field: str = "name") -> None:
        access = current_access()
        if not access.allows(permission, team):
            await deny(context, grpc.StatusCode.PERMISSION_DENIED, _API + method,
                       f"{field}: principal {access.principal!r} ({access.describe()}) may not {what} of team {team!r}")


def _api_field(error: FieldError) -> FieldError:
    """A core error as the API names it: ``spec.template.max_runtime``, not ``..._s``."""
    if error.field.startswith("spec.template."):
        return template_error(api_error(FieldError("spec." + error.field[len("spec.template."):], error.message)))
    return api_error(error)


def _as_template(replica_spec, template):
    """A kept revision (a replica spec) as the template the spec holds: the fields a
    replica takes from the service are the current template's."""
    return replace(replica_spec, name=template.name, team=template.team, pool=template.pool,
                   priority_class=template.priority_class, preemptible=template.preemptible, kind=template.kind,
                   service=template.service, org=template.org, array=template.array, depends_on=template.depends_on)
