"""The processes of bench/scale_bench.py: the bench's own broker, each service's CPU, RSS
and py-spy profile, read from /proc, and the CPU priority of the processes that stand for
other machines."""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

from gpusched.local_cluster import LocalCluster
from gpusched.ports import free_ports

REPO = Path(__file__).resolve().parents[1]


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (/proc/PID/stat)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def renice(pid: int, niceness: int) -> None:
    """Every thread of ``pid`` at ``niceness``. Linux keeps a nice value per thread (a
    thread started later takes its starter's), so the process's own call would leave the
    threads it already runs (gRPC's, the Kafka client's) at their old priority."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.setpriority(os.PRIO_PROCESS, int(tid), niceness)
        except ProcessLookupError:
            pass   # the thread ended meanwhile


def niceness(pid: int) -> set[int]:
    """The nice values of ``pid``'s threads."""
    values = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            values.add(os.getpriority(os.PRIO_PROCESS, int(tid)))
        except ProcessLookupError:
            pass
    return values


def sim_priority(cluster: LocalCluster, nice: int) -> dict[str, list[int]]:
    """The node hosts and this process (the submitter) at ``nice``; each one's threads'
    nice values, read back."""
    if not nice:
        return {}
    sims = {s.name: s.proc.pid for s in cluster.services if s.alive and s.name.startswith("host-")}
    sims["submitter"] = os.getpid()
    for pid in sims.values():
        renice(pid, nice)
    return {name: sorted(niceness(pid)) for name, pid in sims.items()}


def restore_priority(nice: int) -> None:
    if nice:
        try:
            renice(os.getpid(), 0)
        except PermissionError:   # lowering a nice value takes CAP_SYS_NICE
            print(f"the bench stays at nice {nice}: a takeover's placer starts at it too")


def service_pids(cluster: LocalCluster, broker: "Broker") -> dict[str, int]:
    """Every live service's pid, and the broker's (when the bench started it)."""
    procs = {s.name: s.proc.pid for s in cluster.services if s.alive}
    if (pid := broker.pid()) is not None:
        procs["broker"] = pid
    return procs


async def start_profiles(procs: dict[str, int], out: Path | None) -> list[asyncio.subprocess.Process]:
    """``py-spy record`` of each process (raw collapsed stacks into ``out``) until stopped."""
    if out is None:
        return []
    out.mkdir(parents=True, exist_ok=True)
    spy = Path(sys.executable).parent / "py-spy"
    return [await asyncio.create_subprocess_exec(
        str(spy), "record", "-r", "100", "-f", "raw", "-o", str(out / f"{name}.txt"), "-p", str(pid),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
        for name, pid in procs.items() if name != "broker"]


async def stop_profiles(spies: list[asyncio.subprocess.Process]) -> None:
    for spy in spies:
        spy.send_signal(signal.SIGINT)   # py-spy writes its file on SIGINT
    await asyncio.gather(*(spy.wait() for spy in spies))


class Broker:
    """The bench's own broker on free ports (``deploy/kafka.sh`` with a run dir of its own),
    so its CPU and RSS are this broker's and a broker already answering elsewhere is left
    alone; or the one in ``KAFKA_BOOTSTRAP_SERVERS`` (not started, stopped nor counted)."""

    def __init__(self) -> None:
        self.external = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "")
        self.port = 0 if self.external else free_ports(2, "the bench's broker")
        self.run_dir = REPO / ".run" / f"scale-kafka-{self.port}"
        self._env = {**os.environ, "GPUSCHED_KAFKA_PORT": str(self.port), "GPUSCHED_RUN_DIR": str(self.run_dir)}

    def _kafka_sh(self, action: str) -> str:
        return subprocess.run(["bash", str(REPO / "deploy" / "kafka.sh"), action], env=self._env, check=True,
                              stdout=subprocess.PIPE, text=True).stdout

    def start(self) -> str:
        """The bootstrap address."""
        if self.external:
            return self.external
        return self._kafka_sh("start").strip().splitlines()[-1]

    def stop(self) -> None:
        """Stopped, its data deleted."""
        if not self.external:
            self._kafka_sh("clean")
            self.run_dir.rmdir()

    def pid(self) -> int | None:
        if self.external:
            return None
        try:
            return int((self.run_dir / "kafka" / "kafka.pid").read_text())
        except (OSError, ValueError):
            return None
