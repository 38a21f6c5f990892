"""A local gpusched cluster of real service processes: the demo, benchmarks and tests.

Each service runs as its own process (the console commands), so a test can kill -9 it
exactly as an operator's worst day would. Readiness is the service's own "ready" line
(printed after it has replayed the log and, for admission, serves gRPC).

The services' gRPC servers run in the ``--insecure`` dev mode (plaintext, no identity,
loopback only) unless a ``DevPki`` is given: then they serve TLS, identify callers by
its tokens, JWTs and (``mtls``) client certificates, and check its policy file
(docs/reference/security.md).

On a secured cluster each service logs in to Kafka as its own principal
(``principal_of``, from ``gpusched.adapters.broker.kafka_principals.PRINCIPALS``): its password
comes from ``credentials`` (by default the ``credentials`` file next to the connection's
CA, as deploy/kafka.sh writes them). Each node-agent logs in as its node's own principal
``node-agent.<node>``, made when the agent is first started
(``gpusched.adapters.nodes.node_access.add_node``: this needs the cluster's connection to be the
admin's, as the tests' is). Admission relays the agents' reports into the pool log;
``relay()`` starts one on its own. ``node_host()`` starts many simulated nodes in one
process (``gpusched node-host``).

``netns=`` (each start): run the service in that network namespace (``ip netns exec NS``;
root only), as tests/rig/ does to give every service a host of its own. ``ip netns exec``
execs the command, so the service's pid is the command's own.
"""
from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from gpusched.adapters.broker.kafka_admin import TopicNames
from gpusched.adapters.broker.kafka_principals import principal_of_command
from gpusched.adapters.broker.kafka_security import Where, connection, load_credentials
from gpusched.adapters.nodes.reports import host_principal, node_principal
from gpusched.ports import free_port

if TYPE_CHECKING:
    from gpusched.adapters.broker.dev_pki import DevPki

BIN = Path(sys.executable).parent


def principal_of(command: str, *args: str) -> str:
    """The Kafka principal that ``command`` (a console script, or ``gpusched`` and its
    subcommand in ``args``) logs in as: ``kafka_principals.principal_of_command``. A
    node-agent's or a node host's is its own, given by the caller (``LocalCluster.start``)."""
    name = (args[0] if args else "") if command == "gpusched" else command.removeprefix("gpusched-")
    principal = principal_of_command(name)
    if principal is None:
        raise ValueError(f"no Kafka principal logs in as {command} {' '.join(args[:1])}".rstrip()
                         + " (gpusched.adapters.broker.kafka_principals): pass principal=")
    return principal


@dataclass
class Service:
    name: str
    proc: asyncio.subprocess.Process
    ready_line: str = ""
    log_path: Path | None = None
    metrics_port: int = 0   # its Prometheus /metrics port (LocalCluster(metrics=True))
    _drain: asyncio.Task | None = field(default=None, repr=False)
    _exited: asyncio.Future | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        """Hear the process's exit through a pidfd. Not ``proc.wait()``: that also waits
        for its stdout to close, which a node-agent's worker shims inherit and keep open
        on purpose (they outlive the agent)."""
        loop = asyncio.get_running_loop()
        self._exited = loop.create_future()
        try:
            pidfd = os.pidfd_open(self.proc.pid)
        except ProcessLookupError:   # gone already
            self._exited.set_result(None)
            return

        def on_exit() -> None:
            loop.remove_reader(pidfd)
            os.close(pidfd)
            self._exited.set_result(None)
        loop.add_reader(pidfd, on_exit)

    @property
    def port(self) -> int:
        m = re.search(r"port=(\d+)", self.ready_line)
        return int(m.group(1)) if m else 0

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None

    async def kill9(self) -> None:
        if self.alive:
            self.proc.send_signal(signal.SIGKILL)
        await asyncio.shield(self._exited)

    async def terminate(self, timeout: float = 15.0) -> None:
        if self.alive:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(asyncio.shield(self._exited), timeout)
            except asyncio.TimeoutError:
                await self.kill9()


class LocalCluster:
    def __init__(self, bootstrap: Where, topics: TopicNames, log_dir: Path, partitions: int = 4,
                 job_retention_s: float | None = None, credentials: dict[str, str] | None = None,
                 pki: "DevPki | None" = None, mtls: bool = False, metrics: bool = False) -> None:
        self.connection = connection(bootstrap)
        self.bootstrap = self.connection.bootstrap
        # principal -> password; a test may change one to see a service refused
        self.credentials = dict(credentials if credentials is not None else _default_credentials(self.connection))
        self.topics = topics
        self.log_dir = log_dir
        self.partitions = partitions
        self.job_retention_s = job_retention_s   # None: admission records its default
        self.services: list[Service] = []
        self.pki = pki
        self.mtls = mtls
        self.metrics = metrics   # each service serves /metrics on a port of its own
        log_dir.mkdir(parents=True, exist_ok=True)

    def kafka_env(self, principal: str) -> dict[str, str]:
        """The environment that makes a service log in to Kafka as ``principal``."""
        conn = self.connection
        if conn.secured:
            conn = conn.as_user(principal, self.credentials.get(principal, ""))
        return conn.env()

    def _env(self, principal: str) -> dict[str, str]:
        return {**os.environ, **self.kafka_env(principal),
                "GPUSCHED_TOPIC_PREFIX": self.topics.prefix,
                "GPUSCHED_PARTITIONS": str(self.partitions), "GPUSCHED_LOG_LEVEL": "WARNING",
                "PYTHONUNBUFFERED": "1",
                **({} if self.job_retention_s is None else {"GPUSCHED_JOB_RETENTION_S": repr(self.job_retention_s)}),
                **self._security_env()}

    def _security_env(self) -> dict[str, str]:
        """The servers' security flags (``gpusched.config.SecuritySettings``) as their
        environment variables; a parent's settings are overridden either way."""
        pki = self.pki
        if pki is None:
            return {"GPUSCHED_INSECURE": "1"}
        return {"GPUSCHED_INSECURE": "0", "GPUSCHED_TLS_CERT": str(pki.server_cert),
                "GPUSCHED_TLS_KEY": str(pki.server_key), "GPUSCHED_TOKEN_FILE": str(pki.token_file),
                "GPUSCHED_JWKS_FILE": str(pki.jwks), "GPUSCHED_POLICY_FILE": str(pki.policy),
                "GPUSCHED_TLS_CLIENT_CA": str(pki.ca) if self.mtls else ""}

    async def start(self, name: str, command: str, *args: str, timeout: float = 90.0,
                    principal: str = "", netns: str = "") -> Service:
        if command == "gpusched-node-agent" and not principal:   # its node's own login
            reads_log = "--source" in args and args[list(args).index("--source") + 1] == "log"
            principal = await self.add_node(args[list(args).index("--name") + 1], reads_log=reads_log)
        env = self._env(principal or principal_of(command, *args))
        log_path = self.log_dir / f"{name}.log"
        log = open(log_path, "ab")
        metrics_port = free_port() if self.metrics else 0
        env["GPUSCHED_METRICS_PORT"] = str(metrics_port)
        prefix = ("ip", "netns", "exec", netns) if netns else ()
        proc = await asyncio.create_subprocess_exec(
            *prefix, str(BIN / command), *args, env=env, stdout=asyncio.subprocess.PIPE, stderr=log)
        service = Service(name, proc, log_path=log_path, metrics_port=metrics_port)
        self.services.append(service)
        try:
            service.ready_line = await asyncio.wait_for(self._until_ready(proc), timeout)
        except (asyncio.TimeoutError, EOFError) as exc:
            await service.kill9()
            raise RuntimeError(f"{name} did not become ready; see {log_path}:\n{log_path.read_text()[-3000:]}") from exc
        service._drain = asyncio.create_task(proc.stdout.read())
        return service

    @staticmethod
    async def _until_ready(proc) -> str:
        while True:
            line = await proc.stdout.readline()
            if not line:
                raise EOFError("exited before ready")
            if b" ready" in line:
                return line.decode().strip()

    async def admission(self, name: str = "admission", port: int = 0, *args: str, host: str = "127.0.0.1",
                        netns: str = "") -> Service:
        return await self.start(name, "gpusched-admission", "--listen", f"{host}:{port}", *args, netns=netns)

    async def placer(self, name: str = "placer", *args: str, netns: str = "") -> Service:
        return await self.start(name, "gpusched-placer", *args, netns=netns)

    async def preemptor(self, name: str = "preemptor", *args: str, netns: str = "") -> Service:
        return await self.start(name, "gpusched-preemptor", *args, netns=netns)

    async def agent(self, node: str, simulate: str = "8xH100-80GB", *args: str, netns: str = "") -> Service:
        return await self.start(f"agent-{node}", "gpusched-node-agent", "--name", node, "--simulate", simulate, *args,
                                netns=netns)

    async def node_host(self, host: str, nodes: int, simulate: str = "8xH100-80GB", *args: str,
                        timeout: float = 180.0) -> Service:
        """``gpusched node-host``: ``nodes`` simulated nodes named ``<host>-00000``... in one
        process, logged in as ``node-host.<host>``."""
        principal = await self.add_host(host)
        return await self.start(f"host-{host}", "gpusched", "node-host", "--name", host, "--nodes", str(nodes),
                                "--simulate", simulate, *args, timeout=timeout, principal=principal)

    async def add_host(self, host: str) -> str:
        """The node host's principal, with its login, topics and ACLs made the first time."""
        from gpusched.adapters.nodes.node_access import add_host

        principal = host_principal(host)
        if self.connection.secured and principal not in self.credentials:
            self.credentials[principal] = await add_host(self.connection, self.topics, host)
        return principal

    async def add_node(self, node: str, reads_log: bool = False) -> str:
        """The node's principal, with its login, report topic and ACLs made the first time
        (``reads_log``: its agent folds the pool log, ``--source log``, and may read it)."""
        from gpusched.adapters.nodes.node_access import add_node

        principal = node_principal(node)
        if self.connection.secured and principal not in self.credentials:
            self.credentials[principal] = await add_node(self.connection, self.topics, node, reads_log=reads_log)
        return principal

    async def relay(self, name: str = "relay", *args: str, netns: str = "") -> Service:
        return await self.start(name, "gpusched", "relay", *args, netns=netns)

    async def stop_all(self) -> None:
        await asyncio.gather(*(s.terminate() for s in self.services), return_exceptions=True)


def _default_credentials(conn) -> dict[str, str]:
    if not conn.secured:
        return {}
    path = Path(conn.ca_file).parent / "credentials"
    return load_credentials(path) if path.exists() else {}
