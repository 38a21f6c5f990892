"""The test brokers: ``KafkaControl`` drives deploy/kafka.sh for one (start, stop, kill
one node, restart), ``start_private_cluster`` gives a module a secured cluster of its
own. The session broker's fixtures are in tests/conftest.py."""
from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from gpusched.adapters.broker.kafka_security import KafkaConnection, load_credentials
from gpusched.ports import free_ports

REPO = Path(__file__).resolve().parents[1]
KAFKA_SH = REPO / "deploy" / "kafka.sh"
SECURITY = os.environ.get("GPUSCHED_TEST_KAFKA_SECURITY", "sasl_ssl")


class KafkaControl:
    """Drives deploy/kafka.sh for the test broker. Sync methods block; use the
    ``*_async`` ones inside async tests so clients on the loop keep running."""

    def __init__(self, bootstrap: str, managed: bool, port: int = 0,
                 run_dir: Path | None = None, brokers: int = 1, security: str = SECURITY) -> None:
        self.managed = managed  # False: external cluster, not ours to stop
        self.run_dir = run_dir
        self.running = True
        self.security = security if managed else "external"
        self.credentials: dict[str, str] = {}
        # Ours: plaintext until the first start shows the admin login (``_secured``); an
        # external cluster: the login the environment gives (GPUSCHED_KAFKA_*).
        self.connection = KafkaConnection(bootstrap) if managed else KafkaConnection.from_env(bootstrap=bootstrap)
        env = dict(os.environ)
        if managed:
            env.pop("KAFKA_BOOTSTRAP_SERVERS", None)
            env.update(GPUSCHED_KAFKA_PORT=str(port), GPUSCHED_RUN_DIR=str(run_dir),
                       GPUSCHED_KAFKA_SECURITY=security, GPUSCHED_KAFKA_BROKERS=str(brokers))
        self._env = env

    @property
    def bootstrap(self) -> KafkaConnection:
        return self.connection

    def _secured(self) -> None:
        """After the first start: the admin login and the services' passwords that
        deploy/kafka.sh made in the run dir."""
        if not self.managed or self.security != "sasl_ssl" or self.credentials:
            return
        secrets = self.run_dir / "kafka" / "secrets"
        self.credentials = load_credentials(secrets / "credentials")
        self.connection = KafkaConnection(self.connection.bootstrap, "SASL_SSL", "admin",
                                          self.credentials["admin"], str(secrets / "ca.pem"))

    def _args(self, action: str, *more: str) -> list[str]:
        return ["bash", str(KAFKA_SH), action, *more]

    def _check(self, action: str, rc: int, out: str) -> None:
        if rc != 0:
            raise RuntimeError(f"deploy/kafka.sh {action} failed (rc={rc}):\n{out}")

    def run(self, action: str) -> None:
        p = subprocess.run(self._args(action), env=self._env, cwd=REPO, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self._check(action, p.returncode, p.stdout)
        self.running = action == "start"
        if self.running:
            self._secured()

    async def run_async(self, action: str, *more: str) -> None:
        p = await asyncio.create_subprocess_exec(
            *self._args(action, *more), env=self._env, cwd=REPO,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        out, _ = await p.communicate()
        self._check(action, p.returncode or 0, out.decode(errors="replace"))
        if not more:   # a single node killed: the cluster still runs
            self.running = action == "start"

    # stop = controlled shutdown (SIGTERM), kill = crash (SIGKILL); start waits
    # until the broker answers. Data survives all of them.
    def stop(self) -> None: self.run("stop")
    def kill(self) -> None: self.run("kill")
    async def kill_node_async(self, node: int) -> None: await self.run_async("kill", str(node))
    def start(self) -> None: self.run("start")
    async def stop_async(self) -> None: await self.run_async("stop")
    async def kill_async(self) -> None: await self.run_async("kill")
    async def start_async(self) -> None: await self.run_async("start")

    async def restart_async(self, hard: bool = False) -> None:
        await (self.kill_async() if hard else self.stop_async())
        await self.start_async()


def note_cluster(port: int, run_dir: Path, brokers: int) -> None:
    """deploy/test.sh passes a file to note each cluster in, so that it can stop them
    should pytest die before the fixtures' teardown."""
    if note := os.environ.get("GPUSCHED_TEST_BROKER_NOTE"):
        with open(note, "a") as f:
            f.write(f"{port} {run_dir} {brokers}\n")


def start_private_cluster(brokers: int, request: pytest.FixtureRequest):
    """A private secured cluster of ``brokers`` nodes for one module (the durability
    tests need three), stopped and removed afterwards as the session broker is."""
    port = free_ports(2 * brokers, "the test brokers")
    run_dir = REPO / ".run" / f"test-kafka{brokers}-{port}"
    bootstrap = ",".join(f"127.0.0.1:{port + 2 * i}" for i in range(brokers))
    control = KafkaControl(bootstrap, managed=True, port=port, run_dir=run_dir, brokers=brokers,
                           security="sasl_ssl")
    control.run("clean")
    note_cluster(port, run_dir, brokers)
    control.start()
    try:
        yield control
    finally:
        failed = request.session.testsfailed
        control.stop()
        if request.session.testsfailed == failed == 0:
            shutil.rmtree(run_dir, ignore_errors=True)
