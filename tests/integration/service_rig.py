"""What the services' integration tests share: a real nginx in front of a service, kept
current by a real ``gpusched lb nginx`` process; a load generator that records every
answer; HTTP fetches; and the cleanup of workers an agent leaves running."""
from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from gpusched.ports import free_port
from gpusched_node_agent.runner import STATUS_FILE, read_status
from tests.polling import eventually

MODEL_SERVER = Path(__file__).resolve().parents[1] / "workloads" / "model_server.py"
REPO = Path(__file__).resolve().parents[2]


def model_server(*args: str) -> tuple[str, ...]:
    return (sys.executable, str(MODEL_SERVER), *args)


def kill_workers_left(state_dir: Path) -> None:
    """SIGKILL every workload and shim still running under ``state_dir`` (a test that
    failed early): the agent leaves its workers running when it stops."""
    for path in state_dir.glob(f"*/{STATUS_FILE}"):
        status = read_status(path) or {}
        if "ended_at" in status:
            continue
        for pid, kill in ((status.get("pid"), os.killpg), (status.get("shim_pid"), os.kill)):
            if isinstance(pid, int) and pid > 1:
                try:
                    kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


async def fetch(endpoint: str, path: str = "/") -> str:
    def get() -> str:
        with urllib.request.urlopen(f"http://{endpoint}{path}", timeout=5) as answer:
            return answer.read().decode()
    return await asyncio.to_thread(get)


class Nginx:
    """nginx (http) listening on a free loopback port, proxying to the upstream
    ``gpusched_<service>`` that ``upstream_file`` holds."""

    def __init__(self, root: Path, service: str) -> None:
        self.root, self.port = root, free_port()
        self.upstream_file = root / f"{service}.upstream.conf"
        root.mkdir(parents=True, exist_ok=True)
        temp = "".join(f"{name}_temp_path {root}/{name};\n" for name in
                       ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
        self.conf = root / "nginx.conf"
        self.conf.write_text(
            f"worker_processes 1;\npid {root}/nginx.pid;\nerror_log {root}/error.log;\n"
            "events { worker_connections 512; }\n"
            f"http {{\n access_log off;\n {temp}"
            f" include {self.upstream_file};\n"
            f" server {{\n  listen 127.0.0.1:{self.port};\n"
            f"  location / {{ proxy_pass http://gpusched_{service.replace('-', '_')};\n"
            "   proxy_next_upstream error timeout http_502 http_503; proxy_next_upstream_tries 0;\n"
            "   proxy_connect_timeout 1s; proxy_read_timeout 30s; }\n }\n}\n")
        self.binary = shutil.which("nginx") or "/usr/sbin/nginx"
        self.proc: subprocess.Popen | None = None

    def command(self, *more: str) -> list[str]:
        return [self.binary, "-c", str(self.conf), "-p", str(self.root), *more]

    @property
    def reload_command(self) -> str:
        return " ".join(self.command("-s", "reload"))

    def start(self) -> None:
        """Once the upstream file exists (``gpusched lb nginx`` wrote it)."""
        eventually(self.upstream_file.exists, "the upstream file", timeout=30)
        self.proc = subprocess.Popen(self.command("-g", "daemon off;"), stderr=open(self.root / "stderr.log", "wb"))
        eventually(lambda: self._accepting(), "nginx to listen", timeout=30)

    def _accepting(self) -> bool:
        assert self.proc is not None and self.proc.poll() is None, (self.root / "stderr.log").read_text()
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=2).close()
        except urllib.error.HTTPError:
            return True
        except OSError:
            return False
        return True

    def answers(self, path: str = "/healthz", times: int = 20) -> bool:
        """Whether ``times`` requests in a row through nginx are answered 200 (after a
        reload, nginx's old worker may still take a connection or two). The readiness
        path: the model server does not record it as served."""
        for _ in range(times):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as answer:
                    if answer.status != 200:
                        return False
            except OSError:
                return False
        return True

    def servers(self) -> list[str]:
        """The upstream's servers as written now."""
        return [line.split()[1].rstrip(";") for line in self.upstream_file.read_text().splitlines()
                if line.strip().startswith("server ")]

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(30)


def start_lb(admission_port: int, service: str, nginx: Nginx, activator_port: int | None = None) -> subprocess.Popen:
    """``gpusched lb nginx`` as its own process."""
    args = [sys.executable, "-m", "gpusched.cli", "--endpoint", f"127.0.0.1:{admission_port}", "lb", "nginx",
            service, "--upstream-file", str(nginx.upstream_file), "--reload-command", nginx.reload_command]
    if activator_port is not None:
        args += ["--activator-port", str(activator_port)]
    return subprocess.Popen(args, cwd=REPO, stderr=open(nginx.root / "lb.log", "wb"))


@dataclass
class Load:
    """``threads`` clients asking ``path`` through ``url`` back to back until stopped; every
    answer kept: (status, body, time)."""

    url: str
    threads: int = 4
    answers: list[tuple[int, str, float]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _workers: list[threading.Thread] = field(default_factory=list)

    def start(self) -> "Load":
        for _ in range(self.threads):
            t = threading.Thread(target=self._run, daemon=True)
            t.start()
            self._workers.append(t)
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with urllib.request.urlopen(self.url, timeout=30) as answer:
                    self.answers.append((answer.status, answer.read().decode(), time.time()))
            except urllib.error.HTTPError as exc:
                self.answers.append((exc.code, exc.read().decode(errors="replace"), time.time()))
            except OSError as exc:
                self.answers.append((0, str(exc), time.time()))

    def stop(self) -> list[tuple[int, str, float]]:
        self._stop.set()
        for t in self._workers:
            t.join(60)
        return self.answers
