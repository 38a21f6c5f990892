"""A local gpusched cluster of real service processes: the demo, benchmarks and tests.

Each service runs as its own process (the console commands), so a test can kill -9 it
exactly as an operator's worst day would. Readiness is the service's own "ready" line
(printed after it has replayed the log and, for admission, serves gRPC).
"""
from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

from gpusched.adapters.kafka_admin import TopicNames

BIN = Path(sys.executable).parent


@dataclass
class Service:
    name: str
    proc: asyncio.subprocess.Process
    ready_line: str = ""
    log_path: Path | None = None
    _drain: asyncio.Task | None = field(default=None, repr=False)

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
        await self.proc.wait()

    async def terminate(self, timeout: float = 15.0) -> None:
        if self.alive:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), timeout)
            except asyncio.TimeoutError:
                await self.kill9()


class LocalCluster:
    def __init__(self, bootstrap: str, topics: TopicNames, log_dir: Path, partitions: int = 4,
                 job_retention_s: float | None = None) -> None:
        self.bootstrap = bootstrap
        self.topics = topics
        self.log_dir = log_dir
        self.partitions = partitions
        self.job_retention_s = job_retention_s   # None: admission records its default
        self.services: list[Service] = []
        log_dir.mkdir(parents=True, exist_ok=True)

    def _env(self) -> dict[str, str]:
        return {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": self.bootstrap,
                "GPUSCHED_TOPIC_PREFIX": self.topics.prefix,
                "GPUSCHED_PARTITIONS": str(self.partitions), "GPUSCHED_LOG_LEVEL": "WARNING",
                "PYTHONUNBUFFERED": "1",
                **({} if self.job_retention_s is None else {"GPUSCHED_JOB_RETENTION_S": repr(self.job_retention_s)})}

    async def start(self, name: str, command: str, *args: str, timeout: float = 90.0) -> Service:
        log_path = self.log_dir / f"{name}.log"
        log = open(log_path, "ab")
        proc = await asyncio.create_subprocess_exec(
            str(BIN / command), *args, env=self._env(), stdout=asyncio.subprocess.PIPE, stderr=log)
        service = Service(name, proc, log_path=log_path)
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

    async def admission(self, name: str = "admission", port: int = 0, *args: str) -> Service:
        return await self.start(name, "gpusched-admission", "--listen", f"127.0.0.1:{port}", *args)

    async def placer(self, name: str = "placer", *args: str) -> Service:
        return await self.start(name, "gpusched-placer", *args)

    async def preemptor(self, name: str = "preemptor", *args: str) -> Service:
        return await self.start(name, "gpusched-preemptor", *args)

    async def agent(self, node: str, simulate: str = "8xH100-80GB", *args: str) -> Service:
        return await self.start(f"agent-{node}", "gpusched-node-agent", "--name", node, "--simulate", simulate, *args)

    async def stop_all(self) -> None:
        await asyncio.gather(*(s.terminate() for s in self.services), return_exceptions=True)
