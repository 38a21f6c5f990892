"""The worker shim with real processes: stop forwarding, the kill deadline, fencing on
an expired lease (also with the agent frozen or dead), and lease renewal."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from gpusched_node_agent.lease import NodeLease
from gpusched_node_agent.proc_info import proc_start, proc_stat
from tests.polling import eventually
from tests.unit.node_agent.procs import (GPU, ended_status, events, pid_alive, recorder, shim_command,
                                         shim_program, start_shim, ticking)

KILL_WAIT, POLL = 0.3, 0.05
SLACK = 0.5    # scheduling delays on a loaded machine, on top of the bounds under test


def test_sigterm_is_forwarded_and_the_workload_ends_gracefully(tmp_path):
    shim = start_shim(tmp_path, recorder())
    eventually(lambda: ticking(tmp_path), "the workload's first tick")
    shim.send_signal(signal.SIGTERM)
    assert shim.wait(10) == 143
    status = ended_status(tmp_path)
    assert (status["exit_code"], status["signal"], status["fenced"]) == (143, 0, False)
    assert status["reason"] == "stopped on request; exited with code 143"
    assert events(tmp_path, "end")[-1]["how"] == "term"
    assert events(tmp_path, "start")[0]["gpus"] == GPU and not pid_alive(status["pid"])


def test_a_workload_that_ignores_sigterm_is_killed_after_the_kill_wait(tmp_path):
    shim = start_shim(tmp_path, recorder("--ignore-term"))
    eventually(lambda: ticking(tmp_path), "the workload's first tick")
    asked = time.time()
    shim.send_signal(signal.SIGTERM)
    assert shim.wait(10) == 128 + signal.SIGKILL
    status = ended_status(tmp_path)
    assert (status["exit_code"], status["signal"], status["fenced"]) == (None, signal.SIGKILL, False)
    assert events(tmp_path, "term")[0]["ignored"] is True and not events(tmp_path, "end")
    assert KILL_WAIT <= status["ended_at"] - asked <= KILL_WAIT + SLACK
    assert events(tmp_path, "tick")[-1]["t"] >= asked + KILL_WAIT - 0.1   # it ran on until killed


@pytest.mark.parametrize("ignore_term", [False, True])
def test_an_expired_lease_fences_the_workload_within_expiry_plus_kill_wait_plus_poll(tmp_path, ignore_term):
    lease = NodeLease(tmp_path / "lease")
    lease.renew(time.time() + 30)                # a slow machine may take a while to start Python
    shim = start_shim(tmp_path / "w", recorder(*(["--ignore-term"] if ignore_term else [])), lease=lease.path,
                      kill_wait=KILL_WAIT, poll=POLL)
    # The lease runs out only once the workload ticks, so it has set up its SIGTERM handling:
    # an expiry during its start would end it by the default SIGTERM action, whatever it asked.
    eventually(lambda: ticking(tmp_path / "w"), "the workload's first tick", timeout=30)
    expiry = time.time() + 0.5
    lease.renew(expiry)
    assert shim.wait(10) == (137 if ignore_term else 143)
    status = ended_status(tmp_path / "w")
    assert status["fenced"] is True and status["reason"].startswith("fenced: lease expired at")
    last_tick = events(tmp_path / "w", "tick")[-1]["t"]
    assert expiry - 0.1 <= last_tick <= expiry + KILL_WAIT + POLL + SLACK   # ran until the expiry, not past the bound
    if not ignore_term:
        assert events(tmp_path / "w", "end")[-1]["how"] == "term"
        assert last_tick <= expiry + POLL + SLACK                            # no kill-wait needed


def test_renewing_keeps_the_workload_alive_past_several_lease_periods(tmp_path):
    # Renewed every quarter period: a period long enough that a pause of this process (a
    # full collection late in a long test run) cannot let the lease run out between two.
    lease, period = NodeLease(tmp_path / "lease"), 1.0
    lease.renew(time.time() + 30)                # a slow machine may take a while to start Python
    shim = start_shim(tmp_path / "w", recorder(), lease=lease.path, poll=POLL)
    eventually(lambda: ticking(tmp_path / "w"), "the workload's first tick", timeout=30)
    lease.renew(time.time() + period)
    until = time.time() + 5 * period
    while time.time() < until:                  # the agent's acknowledged heartbeats
        lease.renew(time.time() + period)
        time.sleep(period / 4)
    assert shim.poll() is None and ended_status(tmp_path / "w") is None
    assert events(tmp_path / "w", "tick")[-1]["t"] >= until - 0.2
    revoked = time.time()
    lease.revoke()
    assert shim.wait(10) == 143
    status = ended_status(tmp_path / "w")
    assert status["fenced"] is True and status["ended_at"] - revoked <= POLL + SLACK


PARENT = ("import subprocess, sys, time\n"
            "p = subprocess.Popen(sys.argv[1:], start_new_session=True)\n"
            "print(p.pid, flush=True)\n"
            "time.sleep(600)\n")


def test_the_shim_outlives_its_frozen_then_killed_parent_and_still_fences(tmp_path):
    """A parent process plays the agent: frozen, then killed; the lease is renewed meanwhile
    (as if by the agent's heartbeats), then no more."""
    lease, period = NodeLease(tmp_path / "lease"), 0.3
    lease.renew(time.time() + 10)
    work = tmp_path / "w"
    work.mkdir()
    env = {**os.environ, "GPUSCHED_RECORD": str(work / "record.jsonl"), "CUDA_VISIBLE_DEVICES": GPU}
    parent = subprocess.Popen([sys.executable, "-c", PARENT, *shim_command(work, recorder(), lease.path,
                                                                              KILL_WAIT, POLL)],
                              cwd=work, env=env, stdout=subprocess.PIPE, text=True)
    shim_pid = int(parent.stdout.readline())
    eventually(lambda: ticking(work), "the workload's first tick")
    parent.send_signal(signal.SIGSTOP)
    lease.renew(time.time() + period)
    parent.kill()
    parent.wait(10)
    until = time.time() + 3 * period
    while time.time() < until:
        lease.renew(time.time() + period)
        time.sleep(period / 4)
    assert pid_alive(shim_pid) and ended_status(work) is None
    expiry = time.time() + period
    lease.renew(expiry)                         # the last renewal
    status = eventually(lambda: ended_status(work), "the fenced end", timeout=expiry - time.time() + 10)
    assert status["fenced"] is True and status["shim_pid"] == shim_pid
    last_tick = events(work, "tick")[-1]["t"]
    assert expiry - 0.1 <= last_tick <= expiry + KILL_WAIT + POLL + SLACK
    eventually(lambda: not pid_alive(shim_pid), "the shim to exit")


def test_a_lease_already_expired_means_the_workload_never_starts(tmp_path):
    lease = NodeLease(tmp_path / "lease")
    lease.revoke()
    shim = start_shim(tmp_path / "w", recorder(), lease=lease.path)
    assert shim.wait(10) == 127
    status = ended_status(tmp_path / "w")
    assert status["pid"] is None and status["fenced"] is True and status["reason"].startswith("not started")
    assert events(tmp_path / "w", "start") == []


def test_the_rest_of_the_group_is_stopped_when_the_leader_exits(tmp_path):
    shim = start_shim(tmp_path, ["sh", "-c", "sleep 30 & echo $! > straggler; exit 3"])
    assert shim.wait(10) == 3
    straggler = int((tmp_path / "straggler").read_text())
    status = ended_status(tmp_path)
    assert status["exit_code"] == 3 and status["reason"].startswith("rest of its process group stopped")
    assert not pid_alive(straggler)


@pytest.mark.parametrize("args, field", [
    (["--kill-wait", "-1", "--status", "s"], "--kill-wait"),
    (["--kill-wait", "soon", "--status", "s"], "--kill-wait"),
    (["--kill-wait", "1", "--status", "s", "--poll", "0"], "--poll"),
    (["--status", "s"], "--kill-wait"),
    (["--kill-wait", "1", "--status", "s", "--"], "command"),
])
def test_bad_arguments_are_refused_naming_the_field(tmp_path, args, field):
    done = subprocess.run([*shim_program(), *args, *([] if args[-1] == "--" else ["--", "true"])],
                          cwd=tmp_path, capture_output=True, text=True, timeout=10)
    assert done.returncode == 2 and field in done.stderr


def test_proc_stat_reads_a_process_whatever_its_name(tmp_path):
    """The name in /proc/PID/stat is any bytes, ")" and spaces included: the state and the
    start still come out (a process read as gone would be taken for ended)."""
    name = os.fsencode(tmp_path) + b"/a) b \xff"
    os.symlink(shutil.which("sleep"), name)
    proc = subprocess.Popen([name, "5"])
    try:
        # the child has its parent's name until it has exec'd, and may be in D (loading
        # the program) a moment after: wait for sleep's own sleep under the new name
        eventually(lambda: b"(a) b \xff) S " in _stat_bytes(proc.pid), "the process asleep under its name")
        state, start = proc_stat(proc.pid)
        assert state == "S" and start == proc_start(proc.pid) > 0
    finally:
        proc.kill()
        proc.wait()


def _stat_bytes(pid: int) -> bytes:
    with open(f"/proc/{pid}/stat", "rb") as f:
        return f.read()
