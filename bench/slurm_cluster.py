"""A throwaway Slurm cluster on loopback for bench/peer_slurm.py: one slurmctld and one
slurmd per node, every file (configuration, state, spool, logs, fake GPU devices) in one
folder, no munge (auth/none, cred/none) and no cgroups (proctrack/linuxproc, task/none),
so it starts on any machine with Debian's ``slurm-wlm`` installed.

Each node's GPUs are ``/dev/null`` symlinks named in gres.conf: Slurm counts, allocates
and hands them out (``CUDA_VISIBLE_DEVICES``) as it would real ones. ``SlurmdParameters=
config_overrides`` lets every slurmd report the configured CPUs instead of the host's.

The rendering functions are pure (tests/unit/bench/test_peer_slurm.py reads them).
"""
from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

# What a Slurm admin sets for many short jobs (Slurm's high-throughput guide): schedule
# a batch job as soon as it arrives instead of gathering submissions for up to 3 s
# (batch_sched_delay), no minimum gap between scheduling passes, a deeper queue looked at
# per pass, the FIFO scheduler (backfill's extra passes buy nothing for 1-GPU jobs that
# all fit), ended jobs purged sooner and daemons that log errors only.
TUNED_SCHEDULER_PARAMETERS = "batch_sched_delay=0,sched_min_interval=0,default_queue_depth=1000,max_rpc_cnt=0"
TUNED = {
    "SchedulerType": "sched/builtin",
    "SchedulerParameters": TUNED_SCHEDULER_PARAMETERS,
    "MinJobAge": "5",
    "SlurmctldDebug": "error",
    "SlurmdDebug": "error",
}


@dataclass(frozen=True)
class SlurmLayout:
    """Where a cluster's files go and the ports it listens on (port .. port+nodes)."""
    root: Path
    nodes: int = 4
    gpus: int = 8
    cpus: int = 32
    port: int = 26817

    def node_names(self) -> list[str]:
        return [f"n{i + 1}" for i in range(self.nodes)]

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def dev(self) -> Path:
        return self.root / "dev"


def render_slurm_conf(layout: SlurmLayout, tuned: bool) -> str:
    """slurm.conf: Slurm's defaults, or (``tuned``) with ``TUNED`` on top."""
    r = layout.root
    settings = {
        "ClusterName": "peer",
        "SlurmctldHost": "localhost(127.0.0.1)",
        "SlurmctldPort": str(layout.port),
        "AuthType": "auth/none",
        "CredType": "cred/none",
        "SlurmUser": "root",
        "SlurmdUser": "root",
        "StateSaveLocation": f"{r}/state",
        "SlurmdSpoolDir": f"{r}/spool/%n",
        "SlurmctldPidFile": f"{r}/slurmctld.pid",
        "SlurmdPidFile": f"{r}/slurmd-%n.pid",
        "SlurmctldLogFile": f"{r}/log/slurmctld.log",
        "SlurmdLogFile": f"{r}/log/slurmd-%n.log",
        "ProctrackType": "proctrack/linuxproc",
        "TaskPlugin": "task/none",
        "JobAcctGatherType": "jobacct_gather/none",
        "AccountingStorageType": "accounting_storage/none",
        "JobCompType": "jobcomp/none",
        "SelectType": "select/cons_tres",
        "SelectTypeParameters": "CR_Core",
        "GresTypes": "gpu",
        "SlurmdParameters": "config_overrides",
        "MpiDefault": "none",
        "ReturnToService": "2",
        **(TUNED if tuned else {}),
    }
    lines = [f"{key}={value}" for key, value in settings.items()]
    for i, name in enumerate(layout.node_names()):
        lines.append(f"NodeName={name} NodeHostname=localhost NodeAddr=127.0.0.1 Port={layout.port + 1 + i} "
                     f"CPUs={layout.cpus} RealMemory=64000 Gres=gpu:{layout.gpus} State=UNKNOWN")
    nodes = ",".join(layout.node_names())
    lines.append(f"PartitionName=gpu Nodes={nodes} Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


def render_gres_conf(layout: SlurmLayout) -> str:
    """gres.conf: each node's GPUs as the fake devices dev/nvidia0..N-1."""
    return "".join(f"NodeName={name} Name=gpu File={layout.dev}/nvidia[0-{layout.gpus - 1}]\n"
                   for name in layout.node_names())


# Runs a slurmd in the foreground as its child and reaps every orphan it is given: slurmd
# double-forks each job's slurmstepd, which would otherwise go to init, and its CPU (and
# the job script's, which slurmstepd reaps) would be counted nowhere. With this parent it
# shows in the parent's children's CPU (/proc/<pid>/stat cutime, cstime), as a
# node-agent's shims show in the agent's.
REAPER = """
import ctypes, os, sys
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)   # PR_SET_CHILD_SUBREAPER
daemon = os.posix_spawnp(sys.argv[1], sys.argv[1:], dict(os.environ))
while True:
    try:
        if os.wait()[0] == daemon:
            break
    except ChildProcessError:
        break
"""


class SlurmCluster:
    """slurmctld (a daemon, stopped by its pid file) and the slurmds, each in the
    foreground under a reaper (``REAPER``)."""

    def __init__(self, layout: SlurmLayout) -> None:
        self.layout = layout
        self.env = {**os.environ, "SLURM_CONF": str(layout.conf)}
        self.reapers: dict[str, subprocess.Popen] = {}   # node -> its slurmd's reaper

    def write(self, tuned: bool) -> None:
        r = self.layout.root
        for sub in ("state", "log", "dev", *(f"spool/{n}" for n in self.layout.node_names())):
            (r / sub).mkdir(parents=True, exist_ok=True)
        for g in range(self.layout.gpus):
            device = self.layout.dev / f"nvidia{g}"
            if not device.is_symlink():
                device.symlink_to("/dev/null")
        self.layout.conf.write_text(render_slurm_conf(self.layout, tuned))
        (r / "gres.conf").write_text(render_gres_conf(self.layout))

    def start(self, tuned: bool) -> None:
        self.write(tuned)
        conf = str(self.layout.conf)
        subprocess.run(["slurmctld", "-f", conf, "-i"], env=self.env, check=True)   # -i: no saved state
        for name in self.layout.node_names():
            self.reapers[name] = subprocess.Popen([sys.executable, "-S", "-c", REAPER, "slurmd", "-D", "-f", conf,
                                                   "-N", name], env=self.env, start_new_session=True,
                                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.wait_idle()

    def reconfigure(self, tuned: bool) -> None:
        """The same cluster with the other settings: slurmctld and slurmds restarted on them
        (``scontrol reconfigure`` does not change SchedulerType)."""
        self.stop()
        self.start(tuned)

    def wait_idle(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        want = self.layout.nodes
        while time.monotonic() < deadline:
            out = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], env=self.env, capture_output=True, text=True)
            if out.returncode == 0 and out.stdout.split().count("idle") == want:
                return
            time.sleep(0.2)   # the daemons register with the controller on their own
        raise RuntimeError(f"slurm nodes not idle after {timeout:g}s; see {self.layout.root}/log")

    async def queued(self) -> int:
        """Jobs Slurm still holds (pending, running or completing)."""
        proc = await asyncio.create_subprocess_exec("squeue", "-h", "-o", "%i", env=self.env,
                                                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"squeue failed: {err.decode().strip()}")
        return len(out.split())

    async def submit(self, script: str) -> str:
        """``sbatch`` one 1-GPU job running ``script``; its job id."""
        proc = await asyncio.create_subprocess_exec(
            "sbatch", "--parsable", "--gres=gpu:1", "-o", "/dev/null", "--wrap", script, env=self.env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"sbatch failed: {err.decode().strip()}")
        return out.decode().strip().split(";")[0]

    def pids(self) -> dict[str, list[int]]:
        """The daemons' pids by name: slurmctld's; each slurmd's with its reaper's, which
        holds the CPU of the job launches (slurmstepd and the job)."""
        found: dict[str, list[int]] = {}
        try:
            found["slurmctld"] = [int((self.layout.root / "slurmctld.pid").read_text().split()[0])]
        except (OSError, ValueError, IndexError):
            pass
        for name, reaper in self.reapers.items():
            found[f"slurmd-{name}"] = [reaper.pid, *_children(reaper.pid)]
        return found

    def stop(self) -> None:
        pids = [p for group in self.pids().values() for p in group]
        for path in self.layout.root.glob("*.pid"):
            path.unlink(missing_ok=True)
        for pid in pids:
            _signal(pid, 15)
        deadline = time.monotonic() + 15
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)   # the daemons' own shutdown; SIGKILL below if it hangs
        for pid in pids:
            _signal(pid, 9)
        for reaper in self.reapers.values():
            reaper.wait()
        self.reapers.clear()

    def remove(self) -> None:
        shutil.rmtree(self.layout.root, ignore_errors=True)


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
