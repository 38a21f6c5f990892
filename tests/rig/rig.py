"""A cluster of hosts on one machine: three Kafka brokers, admission, the relay, the placer,
the preemptor and N node-agents, each in a network namespace of its own with an address
of its own (``net.Net``), so that the services reach each other only over that network
and a fault of one link touches only what crosses it.

The brokers are plaintext (deploy/kafka.sh with GPUSCHED_KAFKA_HOSTS/NETNS); the job API
is TLS (a dev PKI whose server certificate names admission's address: the insecure dev
mode is loopback only). Node-agents run real workloads (``--run-processes``) on
simulated GPUs (one each unless ``gpus``), with a short lease, so that an agent cut off from the brokers fences
its workers quickly. The test process in the root namespace is a client over the bridge.

    async with Rig(tmp_path, agents=4) as rig:
        await rig.client.submit(...)

``close`` (also on ``__aexit__``) stops every service, kills what is left in each
namespace (workers outlive their agents on purpose), stops the brokers and removes the
network.
"""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from gpusched.adapters.broker import dev_pki
from gpusched.adapters.broker.kafka_admin import TopicNames, ensure_topics
from gpusched.client import Client, ClientTls
from gpusched.local_cluster import LocalCluster, Service
from tests.rig.net import Net, sh

REPO = Path(__file__).resolve().parents[2]
KAFKA_SH = REPO / "deploy" / "kafka.sh"
WORKLOADS = REPO / "tests" / "workloads"
RECORDER = (sys.executable, str(WORKLOADS / "recorder.py"))
BINDINGS = [{"principal": "alice", "role": "member", "team": "team-a"},
            {"principal": "ops", "role": "operator"}]
BROKERS = ("b1", "b2", "b3")
SERVICES = ("admission", "relay", "placer", "preemptor")
KAFKA_PORT = 9092


@dataclass
class Started:
    """How a service was started, to start it again after a kill."""
    name: str
    host: str
    command: str
    args: tuple[str, ...]
    service: Service | None = None


@dataclass
class Rig:
    root: Path
    agents: int = 4
    gpus: int = 1                  # simulated GPUs per node-agent
    lease: float = 3.0
    heartbeat_timeout: float = 3.0
    net: Net = field(default_factory=Net)
    cluster: LocalCluster | None = None
    client: Client | None = None
    ops: Client | None = None
    started: dict[str, Started] = field(default_factory=dict)
    bootstrap: str = ""
    topics: TopicNames | None = None

    @property
    def nodes(self) -> list[str]:
        return [f"n{i}" for i in range(self.agents)]

    @property
    def state_root(self) -> Path:
        return self.root / "state"

    # --- brokers ---
    def _kafka_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "KAFKA_BOOTSTRAP_SERVERS"}
        env.update(GPUSCHED_RUN_DIR=str(self.root / "run"), GPUSCHED_KAFKA_BROKERS="3",
                   GPUSCHED_KAFKA_PORT=str(KAFKA_PORT), GPUSCHED_KAFKA_SECURITY="plaintext",
                   GPUSCHED_KAFKA_HEAP=os.environ.get("GPUSCHED_RIG_KAFKA_HEAP", "512m"),
                   GPUSCHED_KAFKA_HOSTS=" ".join(self.net.address(b) for b in BROKERS),
                   GPUSCHED_KAFKA_NETNS=" ".join(self.net.hosts[b].netns for b in BROKERS),
                   GPUSCHED_PYTHON=env.get("GPUSCHED_PYTHON", sys.executable))
        return env

    async def kafka(self, *args: str) -> str:
        p = await asyncio.create_subprocess_exec("bash", str(KAFKA_SH), *args, env=self._kafka_env(), cwd=REPO,
                                                 stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await p.communicate()
        if p.returncode:
            raise RuntimeError(f"deploy/kafka.sh {' '.join(args)}: rc {p.returncode}\n{err.decode()[-3000:]}")
        return out.decode().strip()

    def broker_pid(self, broker: str) -> int | None:
        i = BROKERS.index(broker) + 1
        node_dir = self.root / "run" / "kafka" / ("" if i == 1 else f"node-{i}")
        try:
            return int((node_dir / "kafka.pid").read_text())
        except (OSError, ValueError):
            return None

    # --- services ---
    async def start_service(self, name: str) -> Service:
        s = self.started[name]
        s.service = await self.cluster.start(s.name, s.command, *s.args, netns=self.net.hosts[s.host].netns)
        return s.service

    def service(self, name: str) -> Service:
        return self.started[name].service

    def pid_of(self, target: str) -> int | None:
        if target in BROKERS:
            return self.broker_pid(target)
        s = self.started[target].service
        return s.proc.pid if s and s.alive else None

    async def start(self) -> "Rig":
        try:
            await self._start()
        except BaseException:
            await self.close()
            raise
        return self

    async def _start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(self.net.open, [*BROKERS, *SERVICES, *self.nodes])
        self.bootstrap = await self.kafka("start")
        self.topics = TopicNames(f"rig-{self.net.tag}.")
        await ensure_topics(self.bootstrap, self.topics)
        adm = self.net.address("admission")
        pki = dev_pki.write(self.root / "pki", BINDINGS, server_addresses=(adm,))
        self.cluster = LocalCluster(self.bootstrap, self.topics, self.root / "logs", pki=pki)
        self.started = {
            "admission": Started("admission", "admission", "gpusched-admission",
                                 ("--listen", f"{adm}:50051", "--no-relay")),
            "relay": Started("relay", "relay", "gpusched", ("relay",)),
            # snapshots often, so the checker compares many with a replay
            "placer": Started("placer", "placer", "gpusched-placer", ("--snapshot-every-s", "5")),
            "preemptor": Started("preemptor", "preemptor", "gpusched-preemptor",
                                 ("--heartbeat-timeout", str(self.heartbeat_timeout), "--min-runtime", "0")),
        }
        for node in self.nodes:
            self.started[node] = Started(
                f"agent-{node}", node, "gpusched-node-agent",
                ("--name", node, "--simulate", f"{self.gpus}xH100-80GB", "--run-processes",
                 "--state-dir", str(self.state_root / node), "--lease", str(self.lease), "--grace", "1.5",
                 "--heartbeat-interval", "0.3", "--address", self.net.address(node)))
        for name in SERVICES:
            await self.start_service(name)
        await asyncio.gather(*(self.start_service(n) for n in self.nodes))
        target = f"{adm}:{self.service('admission').port}"
        tls = ClientTls.from_files(pki.ca)
        self.client = Client(target, tls, pki.tokens["alice"])
        self.ops = Client(target, tls, pki.tokens["ops"])

    async def restart(self, name: str) -> Service:
        """Start a killed service again (an agent with its state dir, as a host's supervisor would)."""
        service = self.started[name].service
        if service is not None and service.alive:
            await service.kill9()
        if service is not None:
            self.cluster.services.remove(service)
        return await self.start_service(name)

    async def close(self) -> None:
        for c in (self.client, self.ops):
            if c is not None:
                await c.close()
        self.client = self.ops = None
        # nothing paused may stay paused: a stopped process ignores SIGTERM
        for name in self.started:
            pid = self.pid_of(name)
            if pid:
                _signal(pid, signal.SIGCONT)
        for b in BROKERS:
            pid = self.broker_pid(b)
            if pid:
                _signal(pid, signal.SIGCONT)
        if self.cluster is not None:
            await asyncio.gather(*(s.kill9() for s in self.cluster.services), return_exceptions=True)
        for host in list(self.net.hosts.values()):   # workers and shims outlive their agents
            for pid in sh("ip", "netns", "pids", host.netns, check=False).stdout.split():
                if host.name not in BROKERS:
                    _signal(int(pid), signal.SIGKILL)
        if self.bootstrap or (self.root / "run" / "kafka").exists():
            try:
                await self.kafka("kill")
            except Exception as exc:   # noqa: BLE001 - tear down the rest regardless
                print(f"rig: kafka.sh kill: {exc}", file=sys.stderr)
        for host in list(self.net.hosts.values()):
            for pid in sh("ip", "netns", "pids", host.netns, check=False).stdout.split():
                _signal(int(pid), signal.SIGKILL)
        await asyncio.to_thread(self.net.close)

    async def __aenter__(self) -> "Rig":
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.close()


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
