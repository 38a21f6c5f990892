"""gRPC handlers of ClusterService: nodes (list, get, cordon, uncordon), pools (summary,
create, time limits, topology) and, through ``PolicyRpcs``, the cluster policy. Writes are events,
answered once the follower has folded them."""
from __future__ import annotations

import time
import uuid

import grpc

from gpusched.adapters.api.api_time import span_seconds
from gpusched.adapters.api.auth import current_access
from gpusched.adapters.log.publisher import EventPublisher
from gpusched.adapters.api.views import node_message, summary_message
from gpusched.core import events as ev
from gpusched.core import validation as limits
from gpusched.core.queries import pool_summary
from gpusched.core.state import NodeState
from gpusched.core.topology import check_levels
from gpusched.core.validation import FieldError, check_pool_limits, check_pool_name
from gpusched.v1 import cluster_pb2, cluster_pb2_grpc
from gpusched_admission.checks import abort_invalid, check_lengths
from gpusched_admission.convert import api_error
from gpusched_admission.policy_api import PolicyRpcs
from gpusched_admission.read_model import ReadModel


class ClusterServicer(PolicyRpcs, cluster_pb2_grpc.ClusterServiceServicer):
    def __init__(self, model: ReadModel, publisher: EventPublisher, producer: str) -> None:
        self.model = model
        self.publisher = publisher
        self.producer = producer

    async def ListNodes(self, request, context):
        states = self.model.follower.states.values()
        nodes = ([(n, s) for s in states for n in s.nodes.values()
                  if not request.pool or n.info.pool == request.pool])
        nodes.sort(key=lambda pair: pair[0].name)
        return cluster_pb2.ListNodesResponse(nodes=[node_message(node, state) for node, state in nodes])

    async def GetNode(self, request, context):
        node = await self._node_or_abort(request.name, context)
        return node_message(node, self.model.state_for_pool(node.info.pool))

    async def GetPoolSummary(self, request, context):
        pool = request.pool or "default"
        state = self.model.state_for_pool(pool)
        if state is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"pool: no pool {pool!r}")
        return summary_message(pool_summary(state, pool))

    async def CordonNode(self, request, context):
        check_lengths(("reason", request.reason, limits.MAX_REASON))
        node = await self._node_or_abort(request.name, context)
        event = ev.NodeCordoned(event_id=uuid.uuid4().hex, time=time.time(), producer=self.producer,
                                node=node.name, reason=request.reason or "cordoned by operator",
                                principal=current_access().principal)
        return await self._apply(event, node, context)

    async def UncordonNode(self, request, context):
        node = await self._node_or_abort(request.name, context)
        event = ev.NodeUncordoned(event_id=uuid.uuid4().hex, time=time.time(), producer=self.producer,
                                  node=node.name, principal=current_access().principal)
        return await self._apply(event, node, context)

    async def CreatePool(self, request, context):
        """Idempotent: a pool that exists is answered with its summary."""
        pool = request.pool
        errors = check_pool_name(pool)
        if errors:
            await abort_invalid(context, errors)
        if pool not in self.model.known_pools():
            event = ev.PoolCreated(event_id=uuid.uuid4().hex, time=time.time(), producer=self.producer, pool=pool,
                                   principal=current_access().principal)
            await self.model.follower.wait_applied(await self.publisher.publish(event, pool))
        return summary_message(pool_summary(self.model.state_for_pool(pool), pool))

    async def SetPoolTimeLimits(self, request, context):
        pool = request.pool
        default_s = span_seconds(request.default_time_limit, "default_time_limit")
        max_s = span_seconds(request.max_time_limit, "max_time_limit")
        errors = [s for s in (default_s, max_s) if isinstance(s, FieldError)]
        if not errors:
            errors = [api_error(e) for e in check_pool_limits(pool, default_s, max_s)]
        errors += check_pool_name(pool) if pool else []
        if errors:
            await abort_invalid(context, errors)
        event = ev.PoolTimeLimitsSet(event_id=uuid.uuid4().hex, time=time.time(), producer=self.producer, pool=pool,
                                     default_s=default_s, max_s=max_s,
                                     principal=current_access().principal)
        pos = await self.publisher.publish(event, pool)
        await self.model.follower.wait_applied(pos)
        return summary_message(pool_summary(self.model.state_for_pool(pool), pool))

    async def SetPoolTopology(self, request, context):
        """A pool's levels (``gpusched.core.topology``); empty: back to the default ones.
        As the time limits, they may be set before the pool's first node registers."""
        pool, levels = request.pool, tuple(request.levels)
        errors = check_pool_name(pool)
        if not errors:
            problem = check_levels(levels)
            errors = [FieldError(*problem.split(": ", 1))] if problem else []
        if errors:
            await abort_invalid(context, errors)
        event = ev.PoolTopologySet(event_id=uuid.uuid4().hex, time=time.time(), producer=self.producer, pool=pool,
                                   levels=levels, principal=current_access().principal)
        await self.model.follower.wait_applied(await self.publisher.publish(event, pool))
        return summary_message(pool_summary(self.model.state_for_pool(pool), pool))

    async def _apply(self, event, node: NodeState, context):
        pos = await self.publisher.publish(event, node.info.pool)
        await self.model.follower.wait_applied(pos)
        return node_message(self.model.node(node.name), self.model.state_for_pool(node.info.pool))

    async def _node_or_abort(self, name: str, context) -> NodeState:
        if not name:
            await abort_invalid(context, [FieldError("name", "must not be empty")])
        check_lengths(("name", name, limits.MAX_ID))
        node = self.model.node(name)
        if node is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"name: no node {name!r}")
        return node
