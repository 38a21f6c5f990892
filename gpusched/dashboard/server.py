"""The dashboard service: a standard-library HTTP server in front of one gRPC client.

The client lives on an asyncio loop in a thread of its own, which also samples the pools
every ``interval_s`` (their charts) and follows WatchJobs (the events of each job page);
the HTTP threads hand it their calls. Read-only: GET and HEAD only."""
from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable
from urllib.parse import unquote, urlsplit

import grpc

from gpusched.client import TERMINAL, Client
from gpusched.dashboard import pages
from gpusched.dashboard.model import EventBook, History, timeline
from gpusched.v1 import types_pb2

log = logging.getLogger("gpusched.dashboard")
ACTIVE = tuple(p for p in types_pb2.JobPhase.values() if p not in TERMINAL and p != types_pb2.JOB_PHASE_UNSPECIFIED)
CALL_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class Settings:
    endpoint: str
    interval_s: float = 5.0     # between pool samples
    history: int = 720          # samples kept per pool
    refresh_s: int = 10         # the overview reloads itself this often (0: never)


class Backend:
    """The gRPC side: a loop thread with the client, the sampler and the watch."""

    def __init__(self, settings: Settings, make_client: Callable[[], Client]) -> None:
        self.settings = settings
        self.history = History(settings.history)
        self.events = EventBook()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="dashboard-grpc", daemon=True)
        self._thread.start()

        async def start() -> Client:   # a grpc.aio channel belongs to the loop it is made on
            client = make_client()
            self._tasks = [asyncio.create_task(self._sample(client)), asyncio.create_task(self._watch(client))]
            return client
        self.client = self.call(start())

    def call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(CALL_TIMEOUT_S)

    def close(self) -> None:
        async def stop() -> None:
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await self.client.close()
        self.call(stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()

    async def _sample(self, client: Client) -> None:
        while True:
            try:
                self.history.record(await client.nodes())
            except grpc.aio.AioRpcError as exc:
                log.warning("sampling the pools: %s %s", exc.code().name, exc.details())
            await asyncio.sleep(self.settings.interval_s)

    async def _watch(self, client: Client) -> None:
        """Every job change while the dashboard runs; after a broken stream, again (the
        current states it starts with show what changed meanwhile)."""
        while True:
            try:
                async with contextlib.aclosing(client.watch()) as updates:
                    async for update in updates:
                        self.events.record(update.job, update.event_type, update.offset)
            except grpc.aio.AioRpcError as exc:
                log.warning("watching jobs: %s %s", exc.code().name, exc.details())
            await asyncio.sleep(1.0)

    # --- what the pages need -------------------------------------------------------------
    def overview(self) -> str:
        async def read():
            return await self.client.nodes(), await self.client.list_all(phases=ACTIVE), await services()

        async def services():
            try:
                return await self.client.list_services()
            except grpc.aio.AioRpcError as exc:
                if exc.code() is grpc.StatusCode.UNIMPLEMENTED:   # an admission that serves no services
                    return None
                raise
        nodes, jobs, services_now = self.call(read())
        return pages.overview(self.history.pools(), nodes, jobs, self.settings.endpoint, self.settings.refresh_s,
                              services_now)

    def job(self, job_id: str) -> str:
        job = self.call(self.client.get(job_id))
        return pages.job_page(job, timeline(job, self.events.of(job_id)))


def handler_for(backend: Backend) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "gpusched-dashboard"

        def do_GET(self) -> None:
            self._respond(head=False)

        def do_HEAD(self) -> None:
            self._respond(head=True)

        def _respond(self, head: bool) -> None:
            path = urlsplit(self.path).path
            try:
                if path == "/":
                    status, body = 200, backend.overview()
                elif path.startswith("/job/") and len(path) > len("/job/"):
                    status, body = 200, backend.job(unquote(path[len("/job/"):]))
                elif path == "/healthz":
                    self._send(200, "ok\n", "text/plain", head)
                    return
                else:
                    status, body = 404, pages.error_page(404, f"no page at {path}")
            except grpc.aio.AioRpcError as exc:
                status, body = _status_of(exc), pages.error_page(
                    _status_of(exc), f"admission at {backend.settings.endpoint}: {exc.code().name}: {exc.details()}")
            except TimeoutError:
                status, body = 504, pages.error_page(504, f"admission at {backend.settings.endpoint} did not answer "
                                                          f"within {CALL_TIMEOUT_S:g} s")
            self._send(status, body, "text/html; charset=utf-8", head)

        def _send(self, status: int, body: str, content_type: str, head: bool) -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            if not head:
                self.wfile.write(data)

        def log_message(self, fmt: str, *args) -> None:
            log.debug("%s " + fmt, self.address_string(), *args)
    return Handler


def _status_of(exc: grpc.aio.AioRpcError) -> int:
    return {grpc.StatusCode.NOT_FOUND: 404, grpc.StatusCode.INVALID_ARGUMENT: 400,
            grpc.StatusCode.PERMISSION_DENIED: 403, grpc.StatusCode.UNAUTHENTICATED: 401,
            grpc.StatusCode.UNAVAILABLE: 503, grpc.StatusCode.DEADLINE_EXCEEDED: 504}.get(exc.code(), 502)


def serve(listen: tuple[str, int], settings: Settings, make_client: Callable[[], Client],
          ready: Callable[[str], None] = print) -> None:
    """Serves until interrupted; ``ready`` is told the address (a port of 0 picks a free one)."""
    backend = Backend(settings, make_client)
    server = ThreadingHTTPServer(listen, handler_for(backend))
    server.daemon_threads = True
    host, port = server.server_address[:2]
    ready(f"dashboard: serving http://{host}:{port}/ (admission {settings.endpoint}); Ctrl-C stops it")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        backend.close()
