"""The servers' last resort: an unexpected exception is INTERNAL with a generic message
(its text never leaves the server; its traceback is logged), a ``RequestRefused`` its
own status, and bytes that are not the request message INVALID_ARGUMENT."""
from __future__ import annotations

import logging

import grpc
import pytest

from gpusched.adapters.api.grpc_server import INTERNAL_MESSAGE, RequestRefused, start_server
from gpusched.adapters.api.server_security import ServerSecurity
from gpusched.v1 import admission_pb2


async def _boom(request, context):
    raise RuntimeError("secret detail")


async def _refused(request, context):
    raise RequestRefused(grpc.StatusCode.RESOURCE_EXHAUSTED, "spec.team: over the limit")


async def _echo(request, context):
    return request


async def _stream_boom(request, context):
    yield request
    raise KeyError("secret key")


def _register(server) -> None:
    parse, dump = admission_pb2.GetJobRequest.FromString, admission_pb2.GetJobRequest.SerializeToString
    handlers = {
        "Boom": grpc.unary_unary_rpc_method_handler(_boom, parse, dump),
        "Refused": grpc.unary_unary_rpc_method_handler(_refused, parse, dump),
        "Echo": grpc.unary_unary_rpc_method_handler(_echo, parse, dump),
        "StreamBoom": grpc.unary_stream_rpc_method_handler(_stream_boom, parse, dump),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("test.Guarded", handlers),))


@pytest.fixture
async def channel():
    server, port, _ = await start_server("127.0.0.1:0", [_register], [], ServerSecurity(None, ()))   # dev mode
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        yield ch
    await server.stop(None)


async def _status(call) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    return err.value.code(), err.value.details()


async def test_an_unexpected_exception_is_internal_with_a_generic_message_and_logged(channel, caplog):
    good = admission_pb2.GetJobRequest(job_id="j").SerializeToString()
    with caplog.at_level(logging.ERROR, logger="gpusched.grpc"):
        code, details = await _status(channel.unary_unary("/test.Guarded/Boom")(good))
    assert code == grpc.StatusCode.INTERNAL and details == INTERNAL_MESSAGE
    assert "secret" not in details
    assert any(r.exc_info and "secret detail" in str(r.exc_info[1]) for r in caplog.records)
    stream = channel.unary_stream("/test.Guarded/StreamBoom")(good)
    code, details = await _status(_drain(stream))
    assert code == grpc.StatusCode.INTERNAL and details == INTERNAL_MESSAGE


async def _drain(stream) -> None:
    async for _ in stream:
        pass


async def test_request_refused_is_answered_with_its_own_status(channel):
    code, details = await _status(channel.unary_unary("/test.Guarded/Refused")(b""))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and details == "spec.team: over the limit"


async def test_bytes_that_are_not_the_request_are_invalid_argument(channel):
    code, details = await _status(channel.unary_unary("/test.Guarded/Echo")(b"\x0a\x03\xff\xfe\xfd"))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("request: not a valid message")
    assert await channel.unary_unary("/test.Guarded/Echo")(b"\x0a\x01j") == b"\x0a\x01j"
