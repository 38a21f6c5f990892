"""A replica's readiness checks as its agent runs them (services/node-agent/readiness.py),
against a real HTTP server on 127.0.0.1 and real commands: thresholds in a row, a
timeout is a failure, each change is handed on once."""
from __future__ import annotations

import asyncio

import pytest

from gpusched.core.model import Readiness
from gpusched.ports import free_port
from gpusched_node_agent.readiness import (ReadinessWatch, command_check, http_check, keep_port, kept_port,
                                           probe_for)

FAST = dict(period_s=0.02, timeout_s=0.5)


class ScriptedServer:
    """Answers each GET with the next status of ``script``, then 200 for ever; a GET of
    /slow is never answered."""

    def __init__(self, script: list[int]) -> None:
        self.script = list(script)
        self.asked = 0
        self.server: asyncio.AbstractServer | None = None
        self.port = 0

    async def __aenter__(self) -> "ScriptedServer":
        self.server = await asyncio.start_server(self._answer, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc) -> None:
        self.server.close()
        await self.server.wait_closed()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await reader.readline()
        while (await reader.readline()) not in (b"\r\n", b""):
            pass
        if b" /slow " in request:
            await asyncio.sleep(30)
        code = self.script[self.asked] if self.asked < len(self.script) else 200
        self.asked += 1
        writer.write(f"HTTP/1.0 {code} X\r\nContent-Length: 0\r\n\r\n".encode())
        await writer.drain()
        writer.close()


class Changes:
    """What a watch handed on, and a way to await the n-th."""

    def __init__(self) -> None:
        self.seen: list[tuple[bool, str]] = []
        self.grew = asyncio.Event()

    async def __call__(self, ready: bool, reason: str) -> None:
        self.seen.append((ready, reason))
        self.grew.set()

    async def until(self, n: int, timeout: float = 10.0) -> list[tuple[bool, str]]:
        async def wait() -> None:
            while len(self.seen) < n:
                self.grew.clear()
                await self.grew.wait()
        await asyncio.wait_for(wait(), timeout)
        return self.seen


async def _watch(readiness: Readiness, probe, changes: Changes, ready: bool | None = False):
    return asyncio.create_task(ReadinessWatch(readiness, probe, changes, ready).run())


async def _stop(task: asyncio.Task) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def test_results_in_a_row_change_readiness_once_each_way():
    watch = ReadinessWatch(Readiness(http_path="/", success_threshold=2, failure_threshold=3), None, Changes())
    verdicts = [watch.count(ok) for ok in (True, False, True, True, True, False, False, True, False, False, False,
                                           False)]
    assert verdicts == [None, None, None, True, None, None, None, None, None, None, False, None]
    unknown = ReadinessWatch(Readiness(http_path="/"), None, Changes(), ready=None)   # defaults: 1 pass, 3 failures
    assert [unknown.count(ok) for ok in (False, False, False, False, True, True)] == [None, None, False, None, True,
                                                                                     None]


async def test_an_http_check_makes_a_replica_ready_after_its_passes_and_unready_after_its_failures():
    async with ScriptedServer([503, 200, 200, 503, 503, 200, 200]) as server:
        changes = Changes()
        readiness = Readiness(http_path="/healthz", success_threshold=2, failure_threshold=2, **FAST)
        task = await _watch(readiness, probe_for(readiness, server.port, {}), changes)
        try:
            assert await changes.until(3) == [(True, "http 200"), (False, "http 503"), (True, "http 200")]
            asked = server.asked
            while server.asked < asked + 5:     # more passes change nothing: each change is handed on once
                await asyncio.sleep(readiness.every_s)
            assert changes.seen == [(True, "http 200"), (False, "http 503"), (True, "http 200")]
        finally:
            await _stop(task)


async def test_no_answer_within_the_timeout_and_a_refused_connection_are_failures():
    async with ScriptedServer([]) as server:
        changes = Changes()
        readiness = Readiness(http_path="/slow", timeout_s=0.1, period_s=0.02, failure_threshold=1)
        task = await _watch(readiness, probe_for(readiness, server.port, {}), changes, ready=True)
        try:
            assert await changes.until(1) == [(False, "no answer within 0.1s")]
        finally:
            await _stop(task)
        assert await http_check(server.port, "/", 1.0) == (True, "http 200")
    assert await http_check(free_port(""), "/healthz", 1.0) == (False, "connection refused")


async def test_a_command_check_passes_on_exit_0_and_is_told_the_port(tmp_path):
    counter = tmp_path / "count"
    # fails twice (exit 1), then passes while PORT is the replica's
    script = f'n=$(cat {counter} 2>/dev/null || echo 0); echo $((n+1)) > {counter}; ' \
             '[ "$n" -ge 2 ] && [ "$PORT" = 8123 ]'
    readiness = Readiness(command=("sh", "-c", script), failure_threshold=1, **FAST)
    changes = Changes()
    task = await _watch(readiness, probe_for(readiness, 8123, {"PORT": "8123"}), changes, ready=None)
    try:
        assert await changes.until(2) == [(False, "exit 1"), (True, "exit 0")]
    finally:
        await _stop(task)
    assert int(counter.read_text()) >= 3
    assert await command_check(("sleep", "5"), {}, 0.1) == (False, "no exit within 0.1s")
    assert (await command_check(("/nonexistent/check",), {}, 1.0))[1].startswith("cannot run /nonexistent/check")


async def test_checks_wait_for_the_initial_delay():
    async with ScriptedServer([]) as server:
        changes = Changes()
        readiness = Readiness(http_path="/", initial_delay_s=0.5, period_s=0.02)
        loop = asyncio.get_running_loop()
        began = loop.time()
        task = await _watch(readiness, probe_for(readiness, server.port, {}), changes)
        try:
            assert await changes.until(1) == [(True, "http 200")]
            assert loop.time() - began >= 0.5
        finally:
            await _stop(task)


async def test_without_a_check_a_replica_is_ready_once_started():
    changes = Changes()
    readiness = Readiness()
    assert probe_for(readiness, 8000, {}) is None
    await ReadinessWatch(readiness, None, changes).run()
    assert changes.seen == [(True, "started (no readiness check)")]


def test_the_port_is_kept_in_the_worker_folder(tmp_path):
    assert kept_port(tmp_path / "w") == 0
    keep_port(tmp_path / "w", 8123)
    assert kept_port(tmp_path / "w") == 8123


@pytest.mark.parametrize("path", ["/healthz", "healthz"])
async def test_a_path_is_asked_from_the_root(path):
    async with ScriptedServer([]) as server:
        assert await http_check(server.port, path, 1.0) == (True, "http 200")
