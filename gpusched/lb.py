"""``gpusched lb nginx``: keeps a real load balancer's upstream list equal to a service's
ready replicas, and brings a service scaled to zero back on its first request.

It follows ``WatchEndpoints`` (the whole list again on every change) and writes nginx's
``upstream`` block for the service to a file, atomically (a temporary file renamed over
it), then runs the reload command (``nginx -s reload``: nginx starts new workers with the
new list and lets the old ones finish their requests). It writes and reloads only when
the list changed. A replica that stops being ready leaves the list in the same log
record that starts stopping it, so it leaves nginx's list as soon as the reload ran;
nginx's ``proxy_next_upstream`` (on by default for connection errors) retries a
request that still reached it on another replica.

**The activator.** With ``--activator-port``, a service with no ready replica gets the
activator as its only upstream (Knative's activator does the same): a connection to it
asks the API for one replica (``ScaleService``, only when the service is at zero), waits
until a replica is ready, and then passes the connection's bytes through to it, so the
first request is answered rather than refused. Later requests go to the replica
directly, once the reload ran.
"""
from __future__ import annotations

import asyncio
import logging
import shlex
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import AsyncIterator, Awaitable, Callable, Sequence

import grpc

from gpusched.client import Client

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Endpoint:
    replica: str
    address: str
    port: int


def upstream_name(service: str) -> str:
    return "gpusched_" + service.replace("-", "_")


def render_upstream(service: str, endpoints: Sequence[Endpoint], activator: str = "") -> str:
    """nginx's ``upstream`` block for ``service``: its ready replicas; none: the activator,
    or a server marked down (nginx needs one, and answers 502)."""
    lines = [f"# gpusched lb: the ready replicas of service {service}; rewritten on every change",
             f"upstream {upstream_name(service)} {{"]
    for e in endpoints:
        lines.append(f"    server {e.address}:{e.port} max_fails=1 fail_timeout=2s;   # {e.replica}")
    if not endpoints:
        lines.append(f"    server {activator};   # the activator: no replica is ready" if activator
                     else "    server 127.0.0.1:9 down;   # no replica is ready")
    lines.append("}")
    return "\n".join(lines) + "\n"


class UpstreamFile:
    """The file nginx includes, and the command that makes nginx read it again."""

    def __init__(self, path: Path, reload_argv: Sequence[str]) -> None:
        self.path, self.reload_argv = Path(path), list(reload_argv)
        self.reloads = 0
        self.unloaded = False   # the file changed and no reload has succeeded since

    async def write(self, content: str) -> bool:
        """Write ``content`` and reload, if it differs from the file's; whether it wrote."""
        try:
            if self.path.read_text() == content:
                return False
        except FileNotFoundError:
            pass
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
        with os.fdopen(fd, "w") as f:
            f.write(content)
        os.chmod(tmp, 0o644)
        os.replace(tmp, self.path)
        self.unloaded = True
        await self.reload()
        return True

    async def reload(self) -> bool:
        """Run the reload command; whether nginx now reads the file as written. A failed
        reload (nginx still starting, or restarting) is tried again by ``keep_upstream``."""
        if self.reload_argv:
            proc = await asyncio.create_subprocess_exec(*self.reload_argv, stdout=asyncio.subprocess.DEVNULL,
                                                        stderr=asyncio.subprocess.PIPE)
            _, err = await proc.communicate()
            if proc.returncode != 0:
                log.error("reload command %s failed (%s): %s", self.reload_argv, proc.returncode,
                          err.decode(errors="replace").strip())
                return False
        self.unloaded = False
        self.reloads += 1
        return True


class Activator:
    """Holds connections for a service with no ready replica, asks for one, and passes each
    connection through to the first replica ready."""

    def __init__(self, scale_up: Callable[[], Awaitable[None]], wait_s: float = 300.0) -> None:
        self.scale_up, self.wait_s = scale_up, wait_s
        self.endpoints: list[Endpoint] = []
        self._changed = asyncio.Condition()
        self._asking: asyncio.Task | None = None
        self.held = 0        # connections it passed through
        self.server: asyncio.base_events.Server | None = None

    async def set_endpoints(self, endpoints: list[Endpoint]) -> None:
        async with self._changed:
            self.endpoints = endpoints
            self._changed.notify_all()

    async def start(self, host: str, port: int) -> int:
        self.server = await asyncio.start_server(self._serve, host, port)
        return self.server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            target = await self._ready_endpoint()
            if target is None:
                writer.write(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                await writer.drain()
                return
            up_reader, up_writer = await asyncio.open_connection(target.address, target.port)
            self.held += 1
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        except (ConnectionError, OSError) as exc:
            log.info("activator: connection ended: %s", exc)
        finally:
            writer.close()

    async def _ready_endpoint(self) -> Endpoint | None:
        async with self._changed:
            if not self.endpoints and (self._asking is None or self._asking.done()):
                self._asking = asyncio.create_task(self.scale_up())
            try:
                await asyncio.wait_for(self._changed.wait_for(lambda: bool(self.endpoints)), self.wait_s)
            except TimeoutError:
                return None
            return self.endpoints[0]


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        writer.close()


async def keep_upstream(service: str, lists: AsyncIterator[list[Endpoint]], upstream: UpstreamFile,
                        activator: Activator | None = None, activator_at: str = "", retry_s: float = 1.0) -> None:
    """Rewrite ``upstream`` with every list of endpoints ``lists`` yields; a reload that
    failed is tried again every ``retry_s`` until one succeeds."""
    async def retry() -> None:
        while True:
            await asyncio.sleep(retry_s)
            if upstream.unloaded:
                await upstream.reload()
    retrying = asyncio.create_task(retry())
    try:
        async for endpoints in lists:
            if activator is not None:
                await activator.set_endpoints(endpoints)
            if await upstream.write(render_upstream(service, endpoints, activator_at)):
                log.info("service %s: %d ready replicas written to %s", service, len(endpoints), upstream.path)
    finally:
        retrying.cancel()


class ServiceDeleted(Exception):
    """The service followed was deleted."""


async def endpoint_lists(client: Client, service: str, retry_s: float = 1.0) -> AsyncIterator[list[Endpoint]]:
    """Every list ``WatchEndpoints`` sends, following again after admission went away
    (a restart, another replica behind the balancer); ``ServiceDeleted`` at the end."""
    while True:
        try:
            async for update in client.watch_endpoints(service):
                if update.deleted:
                    raise ServiceDeleted(service)
                yield [Endpoint(e.replica, e.address, e.port) for e in update.endpoints]
        except grpc.aio.AioRpcError as exc:
            if exc.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
                raise
            log.warning("watching service %s: %s; again in %gs", service, exc.code().name, retry_s)
        await asyncio.sleep(retry_s)


async def keep_nginx(client: Client, service: str, upstream_file: Path, reload_command: str,
                     activator_host: str = "127.0.0.1", activator_port: int | None = None,
                     started: Callable[[str], None] = lambda at: None) -> None:
    """``gpusched lb nginx``: follow the service and keep nginx's upstream; with
    ``activator_port`` (0: any free port), the activator for a service at zero."""
    activator, at = None, ""
    if activator_port is not None:
        async def scale_up() -> None:
            if (await client.get_service(service)).desired == 0:
                await client.scale_service(service, 1, reason="a request for a service at zero (activator)")
        activator = Activator(scale_up)
        at = f"{activator_host}:{await activator.start(activator_host, activator_port)}"
    started(at)
    try:
        await keep_upstream(service, endpoint_lists(client, service),
                            UpstreamFile(upstream_file, shlex.split(reload_command)), activator, at)
    finally:
        if activator is not None:
            await activator.stop()
