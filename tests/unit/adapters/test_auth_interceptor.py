"""The auth interceptor on an in-process TLS server: status codes, messages naming the
principal and what it lacked, the denial counter, and fail-closed for unknown methods."""
from __future__ import annotations

import grpc
import pytest

from gpusched.adapters.api import auth

from gpusched.adapters.broker import dev_pki
from gpusched.adapters.api.grpc_server import start_server
from gpusched.adapters.api.server_security import server_security
from gpusched.config import SecuritySettings
from gpusched.client import ClientTls, channel
from gpusched.v1 import node_agent_pb2, node_agent_pb2_grpc

BINDINGS = [{"principal": "alice", "role": "member", "team": "a"}, {"principal": "ops", "role": "operator"}]


class Agent(node_agent_pb2_grpc.NodeAgentServiceServicer):
    """Answers without a node: what is under test is the interceptor in front of it."""

    def __init__(self) -> None:
        self.callers: list[str] = []

    async def GetInventory(self, request, context):
        self.callers.append(auth.current_access().principal)
        return node_agent_pb2.Inventory(gpu_backend="test")

    async def InjectGpuFault(self, request, context):
        self.callers.append(auth.current_access().principal)
        return node_agent_pb2.InjectGpuFaultResponse()


async def _unlisted(request, context):
    return b""


@pytest.fixture
async def server(tmp_path):
    pki = dev_pki.write(tmp_path, BINDINGS)
    security = server_security(SecuritySettings(tls_cert=str(pki.server_cert), tls_key=str(pki.server_key),
                                                token_file=str(pki.token_file), policy_file=str(pki.policy)),
                               "127.0.0.1:0")
    agent = Agent()

    def register(s):
        node_agent_pb2_grpc.add_NodeAgentServiceServicer_to_server(agent, s)
        s.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
            "test.Unlisted", {"Call": grpc.unary_unary_rpc_method_handler(_unlisted)})])
    srv, port, _ = await start_server("127.0.0.1:0", [register], ["gpusched.v1.NodeAgentService"], security)
    stubs = {}
    for principal in ("alice", "ops", None):
        ch = channel(f"127.0.0.1:{port}", ClientTls.from_files(pki.ca), pki.tokens.get(principal, ""))
        stubs[principal] = (ch, node_agent_pb2_grpc.NodeAgentServiceStub(ch))
    yield stubs, agent
    for ch, _ in stubs.values():
        await ch.close()
    await srv.stop(None)


async def _code(call) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value.code(), info.value.details()


async def test_denials_name_the_principal_and_are_counted(server):
    stubs, agent = server
    inject = "/gpusched.v1.NodeAgentService/InjectGpuFault"
    before = auth.DENIALS.copy()
    code, message = await _code(stubs["alice"][1].InjectGpuFault(node_agent_pb2.InjectGpuFaultRequest(xid=79)))
    assert code == grpc.StatusCode.PERMISSION_DENIED
    assert "'alice'" in message and "member@a" in message and "nodes.write" in message
    code, message = await _code(stubs[None][1].GetInventory(node_agent_pb2.GetInventoryRequest()))
    assert code == grpc.StatusCode.UNAUTHENTICATED and "no credentials" in message
    assert auth.DENIALS[(inject, "PERMISSION_DENIED")] == before[(inject, "PERMISSION_DENIED")] + 1
    inventory = "/gpusched.v1.NodeAgentService/GetInventory"
    assert auth.DENIALS[(inventory, "UNAUTHENTICATED")] == before[(inventory, "UNAUTHENTICATED")] + 1
    assert agent.callers == []                                # no denied call reached the handler
    await stubs["alice"][1].GetInventory(node_agent_pb2.GetInventoryRequest())
    await stubs["ops"][1].InjectGpuFault(node_agent_pb2.InjectGpuFaultRequest(xid=79))
    assert agent.callers == ["alice", "ops"]


async def test_a_method_missing_from_the_table_is_denied(server):
    stubs, _ = server
    call = stubs["ops"][0].unary_unary("/test.Unlisted/Call")(b"")
    code, message = await _code(call)
    assert code == grpc.StatusCode.PERMISSION_DENIED and "permission-table entry" in message


async def test_server_reflection_needs_an_identity(server):
    """The streaming wrapper: grpcurl's reflection works with a token, not without."""
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    request = reflection_pb2.ServerReflectionRequest(list_services="")
    ops = reflection_pb2_grpc.ServerReflectionStub(server[0]["ops"][0])
    async for response in ops.ServerReflectionInfo(iter([request])):
        names = {s.name for s in response.list_services_response.service}
        assert "gpusched.v1.NodeAgentService" in names
        break
    anonymous = reflection_pb2_grpc.ServerReflectionStub(server[0][None][0])
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for _ in anonymous.ServerReflectionInfo(iter([request])):
            pass
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
