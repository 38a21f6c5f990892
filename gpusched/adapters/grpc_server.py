"""A gRPC aio server with health checking and reflection, as every service exposes."""
from __future__ import annotations

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from gpusched.adapters.server_security import ServerSecurity


async def start_server(listen: str, registrations, service_names: list[str], security: ServerSecurity,
                       ) -> tuple[grpc.aio.Server, int, health.aio.HealthServicer]:
    """``registrations``: callables ``add(server)``; ``security``: TLS and the auth
    interceptor (``gpusched.config.server_security``). Returns the server, bound port, health."""
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)], interceptors=security.interceptors)
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
