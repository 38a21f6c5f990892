"""The gRPC server interceptor every gpusched server runs: authenticate the call, check
its method in the permission table, count and log denials, and hand the handler the
caller's ``Access`` (``current_access()``) for the per-team checks and read filters.
"""
from __future__ import annotations

import collections
import contextvars
import logging
from typing import Callable

import grpc

from gpusched.adapters.api.identity import AuthError, Authenticator
from gpusched.adapters.api.permissions import METHODS, PUBLIC, Access, Policy

log = logging.getLogger("gpusched.auth")

_ACCESS: contextvars.ContextVar[Access] = contextvars.ContextVar("gpusched_access")
_INSECURE = Access.everything()

# (method, status code name) -> denials since start; metrics exporters read this.
DENIALS: collections.Counter[tuple[str, str]] = collections.Counter()


def current_access() -> Access:
    """The caller of the RPC being handled (everything allowed outside the interceptor:
    the ``--insecure`` dev mode and in-process use)."""
    return _ACCESS.get(_INSECURE)


async def deny(context, code: grpc.StatusCode, method: str, message: str) -> None:
    """Abort the call with ``code`` and count and log it. Handlers use it too, for the
    per-team checks only they can make."""
    DENIALS[(method, code.name)] += 1
    log.warning("denied %s: %s (%s)", method, message, code.name)
    await context.abort(code, message)


class AuthInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, authenticator: Authenticator, policy: Policy) -> None:
        self.authenticator = authenticator
        self.policy = policy

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        if handler is None:
            return None
        method = details.method
        permission = METHODS.get(method)
        if permission == PUBLIC:
            return handler
        metadata = dict(details.invocation_metadata or ())
        check = self._checker(method, permission, metadata.get("authorization"))
        return _wrap(handler, check)

    def _checker(self, method: str, permission: str | None, authorization) -> Callable:
        async def check(context) -> Access | None:
            try:
                principal = self.authenticator.principal(authorization, context.peer_identities())
            except AuthError as exc:
                await deny(context, grpc.StatusCode.UNAUTHENTICATED, method, f"{method}: {exc}")
                return None
            access = self.policy.access(principal)
            if permission is None or not access.allows(permission):
                lacks = f"permission {permission}" if permission else "a permission-table entry for this method"
                await deny(context, grpc.StatusCode.PERMISSION_DENIED, method,
                           f"principal {principal!r} ({access.describe()}) lacks {lacks} for {method}")
                return None
            return access
        return check


def _wrap(handler: grpc.RpcMethodHandler, check: Callable) -> grpc.RpcMethodHandler:
    """The same handler, its behaviour run only after ``check`` passed, with the
    caller's Access in the context variable the handler reads."""
    if handler.unary_unary is not None:
        inner = handler.unary_unary

        async def unary_unary(request, context):
            _ACCESS.set(await check(context))
            return await inner(request, context)
        return grpc.unary_unary_rpc_method_handler(unary_unary, handler.request_deserializer,
                                                   handler.response_serializer)
    if handler.unary_stream is not None:
        inner_stream = handler.unary_stream

        async def unary_stream(request, context):
            _ACCESS.set(await check(context))
            async for item in inner_stream(request, context):
                yield item
        return grpc.unary_stream_rpc_method_handler(unary_stream, handler.request_deserializer,
                                                    handler.response_serializer)
    if handler.stream_stream is not None:   # server reflection
        inner_bidi = handler.stream_stream

        async def stream_stream(requests, context):
            _ACCESS.set(await check(context))
            async for item in inner_bidi(requests, context):
                yield item
        return grpc.stream_stream_rpc_method_handler(stream_stream, handler.request_deserializer,
                                                     handler.response_serializer)
    inner_client = handler.stream_unary

    async def stream_unary(requests, context):
        _ACCESS.set(await check(context))
        return await inner_client(requests, context)
    return grpc.stream_unary_rpc_method_handler(stream_unary, handler.request_deserializer,
                                                handler.response_serializer)
