"""The shim launcher (``launcher.py``): shims are forked by one long-lived process per
agent, and they depend on neither that process nor the agent staying alive."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys

import pytest

from gpusched_node_agent import launcher
from gpusched_node_agent.lease import NodeLease
from gpusched_node_agent.runner import ProcessRun, WorkerExit, group_alive, read_status
from gpusched_node_agent.shim import proc_stat
from tests.unit.node_agent.procs import events, recorder, wait_for

pytestmark = pytest.mark.usefixtures("python_shim")   # the launcher forks the Python shim


def gone(pid: int) -> bool:
    stat = proc_stat(pid)
    return stat is None or stat[0] in "ZX"


async def until(predicate, what: str, timeout: float = 10.0):
    await asyncio.to_thread(wait_for, predicate, what, timeout)


def recorded_run(workdir, *args: str) -> ProcessRun:
    run = ProcessRun(tuple(recorder(*args)), {"GPUSCHED_RECORD": str(workdir / "record.jsonl")}, workdir,
                     kill_wait=0.3)
    run.POLL_S = 0.05
    return run


async def test_a_launcher_killed_leaves_the_workload_running_and_its_end_is_still_reported(tmp_path):
    run = recorded_run(tmp_path / "a", "--duration", "1.5", "--exit", "5")
    await run.start()
    first = (await launcher.launcher()).process.pid
    await until(lambda: events(tmp_path / "a", "tick"), "the first tick")
    os.kill(first, signal.SIGKILL)
    await until(lambda: gone(first) and launcher._current.dead, "the launcher's end seen")
    assert group_alive(run.pid)                                # the workload runs on, shim and all
    assert not gone(read_status(run.status_file)["shim_pid"])
    end = await asyncio.wait_for(run.wait(), 20)               # judged by the status file
    assert end == WorkerExit(5, 0, False, "exited with code 5")
    again = recorded_run(tmp_path / "b", "--duration", "0.05", "--exit", "3")
    await again.start()                                         # a new launcher for the next launch
    assert (await launcher.launcher()).process.pid != first
    assert (await asyncio.wait_for(again.wait(), 20)).exit_code == 3


async def test_a_shim_ending_after_its_launcher_without_a_record_is_judged_killed(tmp_path):
    run = recorded_run(tmp_path / "a")
    await run.start()
    await until(lambda: events(tmp_path / "a", "tick"), "the first tick")
    os.kill((await launcher.launcher()).process.pid, signal.SIGKILL)
    await until(lambda: launcher._current.dead, "the launcher's end seen")
    os.kill(read_status(run.status_file)["shim_pid"], signal.SIGKILL)
    end = await asyncio.wait_for(run.wait(), 20)
    assert (end.exit_code, end.signal) == (137, signal.SIGKILL)
    assert end.reason.startswith("worker shim ended after its launcher (exit code unknown) without recording")
    assert not group_alive(run.pid)


AGENT = """
import asyncio, json, sys
from pathlib import Path
from gpusched_node_agent import launcher, native_shim
from gpusched_node_agent.runner import ProcessRun
native_shim._available = False   # the launcher's Python shim

async def main():
    run = ProcessRun(("sleep", "60"), {}, Path(sys.argv[1]), lease_path=Path(sys.argv[2]), kill_wait=0.3, poll=0.05)
    await run.start()
    print(json.dumps({"pid": run.pid, "launcher": launcher._current.process.pid}), flush=True)
    await asyncio.sleep(60)

asyncio.run(main())
"""


def test_an_agent_killed_leaves_the_workload_fenced_by_its_lease(tmp_path):
    lease = NodeLease(tmp_path / "lease")
    lease.renew(1e12)
    agent = subprocess.Popen([sys.executable, "-c", AGENT, str(tmp_path / "w"), str(lease.path)],
                             stdout=subprocess.PIPE, text=True)
    try:
        started = json.loads(agent.stdout.readline())
    finally:
        agent.kill()
        agent.wait(10)
    wait_for(lambda: gone(started["launcher"]), "the launcher to leave with its agent", 10)
    assert group_alive(started["pid"])                         # the workload outlives both
    lease.revoke()
    wait_for(lambda: not group_alive(started["pid"]), "the fence to end the workload", 10)
    status = wait_for(lambda: (s := read_status(tmp_path / "w" / "shim.json")) and "ended_at" in s and s,
                      "the shim's record of the end", 10)
    assert status["fenced"] is True


async def test_many_concurrent_launches_share_one_launcher_and_each_gets_its_own_end(tmp_path):
    runs = [ProcessRun(("sh", "-c", f"exit {i}"), {}, tmp_path / f"w{i}", kill_wait=1.0) for i in range(40)]
    await asyncio.wait_for(asyncio.gather(*(run.start() for run in runs)), 60)
    ends = await asyncio.wait_for(asyncio.gather(*(run.wait() for run in runs)), 60)
    assert [end.exit_code for end in ends] == list(range(40))
    shims = {read_status(run.status_file)["shim_pid"] for run in runs}
    assert len(shims) == 40
    assert launcher._current is not None and not launcher._current.dead


async def test_the_launcher_tells_when_the_status_is_written_so_a_start_waits_for_no_poll(tmp_path):
    run = ProcessRun(("sleep", "5"), {}, tmp_path / "w", kill_wait=0.3)
    run.START_POLL_S = 60.0   # a start that had to poll the status file would take a minute
    await asyncio.wait_for(run.start(), 15)
    assert run._proc.written.done() and run._proc.written.result() == {"pid": run.pid}
    assert read_status(run.status_file)["pid"] == run.pid   # the word comes after the file
    await run.stop(0.3)
    assert (await asyncio.wait_for(run.wait(), 20)).signal == signal.SIGTERM


async def test_the_launcher_makes_the_workers_folder_and_clears_an_earlier_status(tmp_path, monkeypatch):
    """The agent's process does no file system work for a launch (it would block its
    event loop): the launcher removes an earlier run's status, its shim makes the folder."""
    await launcher.launcher()   # started before the agent's file calls fail below
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    (earlier / "shim.json").write_text(json.dumps({"pid": 1, "ended_at": 1.0, "exit_code": 7}))

    def no_file_work(*args, **kwargs):
        raise AssertionError("the agent's process touched the file system")
    monkeypatch.setattr(os, "mkdir", no_file_work)
    monkeypatch.setattr(os, "unlink", no_file_work)
    fresh = ProcessRun(("sh", "-c", "pwd > here"), {}, tmp_path / "a" / "b" / "w", kill_wait=0.3)
    again = ProcessRun(("sh", "-c", "exit 3"), {}, earlier, kill_wait=0.3)
    for run in (fresh, again):
        run.START_POLL_S = 0.0   # a status file read before the shim's word would be the earlier one
        await asyncio.wait_for(run.start(), 15)
    assert [(await asyncio.wait_for(run.wait(), 20)).exit_code for run in (fresh, again)] == [0, 3]
    monkeypatch.undo()
    assert (fresh.workdir / "here").read_text().strip() == str(fresh.workdir)
    assert read_status(again.status_file)["exit_code"] == 3


# A launcher (the real serve loop) that dies right after forking a shim, before the agent
# hears its pid: run under a subreaper, so the orphaned shim comes back here to be reaped.
DYING_LAUNCHER = """
import ctypes, json, os, signal, socket, sys
from gpusched_node_agent import launcher

ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)   # PR_SET_CHILD_SUBREAPER
agent, theirs = socket.socketpair()
server = os.fork()
if server == 0:
    agent.close()
    def dying_send(conn, message):
        if "pid" in message:               # forked, about to tell the agent: die now
            os.kill(os.getpid(), signal.SIGKILL)
    launcher._send = dying_send
    launcher.serve(theirs)
    os._exit(0)
theirs.close()
workdir = sys.argv[1]
settings = {"command": ["touch", "started"], "status": os.path.join(workdir, "shim.json"), "lease": None,
            "kill_wait": 0.3, "poll": 0.1}
agent.sendall(json.dumps({"id": 1, "shim": settings, "env": {}, "unset": [], "cwd": workdir}).encode() + b"\\n")
assert agent.recv(100) == b""                 # the launcher died without a word
ends = {}
while True:                                   # the launcher, and the shim it forked (adopted here)
    try:
        pid, status = os.waitpid(-1, 0)
    except ChildProcessError:
        break
    ends["launcher" if pid == server else "shim"] = os.waitstatus_to_exitcode(status)
print(json.dumps(ends), flush=True)
"""


def test_a_shim_whose_launcher_dies_before_the_agent_hears_of_it_starts_nothing(tmp_path):
    done = subprocess.run([sys.executable, "-c", DYING_LAUNCHER, str(tmp_path)], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr
    ends = json.loads(done.stdout)
    assert ends == {"launcher": -signal.SIGKILL, "shim": launcher.EXIT_NO_GO}
    assert not (tmp_path / "started").exists()                # no workload ran unseen
    assert not (tmp_path / "shim.json").exists()


async def test_shutdown_ends_and_reaps_the_launcher_and_leaves_its_shims_running(tmp_path):
    run = recorded_run(tmp_path / "a", "--duration", "30")
    await run.start()
    current = await launcher.launcher()
    await launcher.shutdown()
    assert current.process.returncode == 0                    # gone and reaped, not left a zombie
    assert gone(current.process.pid)
    assert group_alive(run.pid)                               # its shim and workload run on
    os.kill(read_status(run.status_file)["shim_pid"], signal.SIGTERM)
    await until(lambda: not group_alive(run.pid), "the workload's end")


async def test_a_shim_gets_exactly_the_environment_asked_for(tmp_path, monkeypatch):
    """A launch sends only how its environment differs from the launcher's: what the
    launcher has and the launch does not is unset, the rest set or changed."""
    monkeypatch.setenv("GPUSCHED_TEST_AGENTS_OWN", "agent")
    monkeypatch.setenv("GPUSCHED_TEST_CHANGED", "before")
    launcher.close()                                       # the next one starts with the variables above
    out, workdir = tmp_path / "env", tmp_path / "w"
    workdir.mkdir()
    env = {"PATH": os.environ["PATH"], "GPUSCHED_TEST_CHANGED": "after", "GPUSCHED_TEST_JOBS_OWN": "job"}
    settings = {"command": ["sh", "-c", f"env > {out}"], "status": str(workdir / "shim.json"), "lease": None,
                "kill_wait": 1.0, "poll": 0.1}
    shim = await (await launcher.launcher()).launch(settings, env, str(workdir))
    assert await asyncio.wait_for(shim.wait(), 20) == 0
    got = dict(line.split("=", 1) for line in out.read_text().splitlines())
    for set_by_sh in ("PWD", "SHLVL", "_", "OLDPWD"):
        got.pop(set_by_sh, None)
    assert got == env


async def test_a_launch_that_changes_path_finds_its_command_there(tmp_path):
    """posix_spawnp looks a command up in the shim's own PATH, not in the environment it
    passes on: a launch's PATH must reach the shim's too."""
    tools, workdir = tmp_path / "tools", tmp_path / "w"
    tools.mkdir()
    (tools / "gpusched-test-tool").write_text("#!/bin/sh\necho found > found\n")
    (tools / "gpusched-test-tool").chmod(0o755)
    env = {**os.environ, "PATH": f"{tools}:{os.environ['PATH']}"}
    settings = {"command": ["gpusched-test-tool"], "status": str(workdir / "shim.json"), "lease": None,
                "kill_wait": 1.0, "poll": 0.1}
    shim = await (await launcher.launcher()).launch(settings, env, str(workdir))
    assert await asyncio.wait_for(shim.wait(), 20) == 0
    assert (workdir / "found").read_text() == "found\n"


async def test_a_forked_shim_records_the_start_the_launcher_read_for_it(tmp_path):
    """The launcher passes the shim its start (clock ticks) with the go: what the status
    records must be the shim's own, which leftovers.py checks a pid against."""
    run = ProcessRun(("sleep", "5"), {}, tmp_path / "w", kill_wait=0.3)
    await asyncio.wait_for(run.start(), 15)
    status = read_status(run.status_file)
    assert status["shim_start"] == run._proc.start == proc_stat(status["shim_pid"])[1]
    await run.stop(0.3)
    await asyncio.wait_for(run.wait(), 20)
