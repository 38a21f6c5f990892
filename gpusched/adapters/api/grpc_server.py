"""A gRPC aio server with health checking and reflection, as every service exposes,
guarded so that no request, however malformed, gets ``UNKNOWN`` or an exception's text."""
from __future__ import annotations

import logging
import time

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from gpusched.adapters.telemetry import metrics
from gpusched.adapters.api.server_security import ServerSecurity
from gpusched.config import process_settings

log = logging.getLogger("gpusched.grpc")

# Messages larger than these are refused by gRPC itself (RESOURCE_EXHAUSTED). A request
# stays far below: every field has a size limit (gpusched.core.validation) and a batch is
# at most 1000 jobs. A response may be a page of 1000 jobs with long commands.
MAX_RECEIVE_BYTES = process_settings().grpc_max_receive_bytes
MAX_SEND_BYTES = process_settings().grpc_max_send_bytes
MESSAGE_SIZE_OPTIONS = [("grpc.max_receive_message_length", MAX_RECEIVE_BYTES),
                        ("grpc.max_send_message_length", MAX_SEND_BYTES)]


class RequestRefused(Exception):
    """Raised by a handler for a client mistake found deep in its work: answered with
    ``code`` and ``message`` (which names the field) by ``GuardInterceptor``."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class _Undecodable:
    """What the guarded deserializer hands a handler for bytes that are not its request
    message (corrupt protobuf, invalid UTF-8 in a string field)."""

    __slots__ = ("message",)

    def __init__(self, message: str) -> None:
        self.message = message


INTERNAL_MESSAGE = "internal error; the server logged it"


class GuardInterceptor(grpc.aio.ServerInterceptor):
    """The last resort of every server: undecodable requests are ``INVALID_ARGUMENT``,
    ``RequestRefused`` its own status, and any other exception ``INTERNAL`` with a
    generic message, its traceback logged (never sent: it may reveal internals)."""

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_streaming:
            return handler   # health and reflection streams: their own libraries' code
        method = handler_call_details.method
        deserialize = _guarded_deserializer(handler.request_deserializer)
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(
                _guarded_unary(handler.unary_unary, method), deserialize, handler.response_serializer)
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(
                _guarded_stream(handler.unary_stream, method), deserialize, handler.response_serializer)
        return handler


def _guarded_deserializer(deserialize):
    if deserialize is None:
        return None

    def guarded(data: bytes):
        try:
            return deserialize(data)
        except Exception as exc:   # DecodeError, or UnicodeDecodeError from some runtimes
            return _Undecodable(f"request: not a valid message ({type(exc).__name__}: corrupt "
                                "protobuf or invalid UTF-8 in a string field)")
    return guarded


async def _answer(exc: BaseException, method: str, context) -> None:
    if isinstance(exc, RequestRefused):
        await context.abort(exc.code, exc.message)
    log.error("%s failed unexpectedly", method, exc_info=exc)
    await context.abort(grpc.StatusCode.INTERNAL, INTERNAL_MESSAGE)


def _guarded_unary(behavior, method: str):
    async def unary(request, context):
        started = time.perf_counter()
        try:
            if isinstance(request, _Undecodable):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
            try:
                return await behavior(request, context)
            except grpc.aio.AbortError:
                raise
            except Exception as exc:
                await _answer(exc, method, context)
        finally:
            metrics.rpc_done(method, time.perf_counter() - started, _code_name(context))
    return unary


def _code_name(context) -> str:
    code = context.code()
    return "OK" if code is None else getattr(code, "name", str(code))


def _guarded_stream(behavior, method: str):
    async def stream(request, context):
        if isinstance(request, _Undecodable):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
        try:
            async for response in behavior(request, context):
                yield response
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await _answer(exc, method, context)
    return stream


async def start_server(listen: str, registrations, service_names: list[str], security: ServerSecurity,
                       ) -> tuple[grpc.aio.Server, int, health.aio.HealthServicer]:
    """``registrations``: callables ``add(server)``; ``security``: TLS and the auth
    interceptor (``gpusched.config.server_security``). Returns the server, bound port, health.
    The guard is outermost: it also answers what the auth interceptor raises unexpectedly."""
    server = grpc.aio.server(interceptors=[GuardInterceptor(), *security.interceptors],
                             options=[("grpc.so_reuseport", 0), *MESSAGE_SIZE_OPTIONS])
    for register in registrations:
        register(server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = [*service_names, health.SERVICE_NAME, reflection.SERVICE_NAME]
    reflection.enable_server_reflection(names, server)
    if security.credentials is None:
        port = server.add_insecure_port(listen)
    else:
        port = server.add_secure_port(listen, security.credentials)
    if port == 0:
        raise RuntimeError(f"cannot listen on {listen}")
    await server.start()
    for name in ["", *service_names]:
        await health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    return server, port, health_servicer


async def set_serving(health_servicer, service_names: list[str], serving: bool = True) -> None:
    status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
    for name in ["", *service_names]:
        await health_servicer.set(name, status)
