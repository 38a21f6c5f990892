"""The compiled shim (``shim.c``) as the agent runs it (``native_shim``): spawned by the
agent's own process, no launcher and no Python in between. Its contract with the
workload (stop, kill deadline, fencing, status file) is tested with both shims in
test_shim.py, test_runner.py and test_leftovers.py."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess

import pytest

from gpusched_node_agent import launcher, native_shim
from gpusched_node_agent.runner import ProcessRun, read_status

pytestmark = pytest.mark.skipif(not native_shim.available(),
                                reason="the compiled shim is not built: deploy/setup.sh builds it with a C compiler")


@pytest.fixture(autouse=True)
def native(monkeypatch):
    monkeypatch.setattr(native_shim, "_available", True)


def _inheritable(fd: int) -> bool:
    try:
        return os.get_inheritable(fd)
    except OSError:   # listdir's own descriptor, closed by now
        return False


async def test_the_shim_is_the_agents_child_and_the_workloads_parent(tmp_path):
    run = ProcessRun(("sh", "-c", f"cat /proc/$PPID/cmdline > {tmp_path / 'argv'}; "
                      f"cut -d' ' -f4 /proc/$PPID/stat > {tmp_path / 'ppid'}; ls /proc/self/fd > {tmp_path / 'fds'}"),
                     {}, tmp_path / "w", kill_wait=1.0)
    before = launcher._current   # an earlier test's, if any
    await run.start()
    assert (await asyncio.wait_for(run.wait(), 20)).exit_code == 0
    argv = (tmp_path / "argv").read_bytes().split(b"\0")
    assert argv[0] == os.fsencode(native_shim.BINARY)
    assert int((tmp_path / "ppid").read_text()) == os.getpid()   # spawned by the agent itself
    assert launcher._current is before                            # no launcher started
    # the workload holds no descriptor of the shim's (its pipe to the agent): only what this
    # process lets every child inherit, and ls's own (3: the folder it lists)
    inherited = {int(fd) for fd in os.listdir("/proc/self/fd") if _inheritable(int(fd))}
    assert {int(fd) for fd in (tmp_path / "fds").read_text().split()} == inherited | {0, 1, 2, 3}


async def test_the_shim_makes_the_folder_and_clears_an_earlier_status_not_the_agent(tmp_path, monkeypatch):
    earlier = tmp_path / "a" / "b"
    earlier.mkdir(parents=True)
    (earlier / "shim.json").write_text(json.dumps({"pid": 1, "ended_at": 1.0, "exit_code": 7}))

    def no_file_work(*args, **kwargs):
        raise AssertionError("the agent's process touched the file system")
    runs = [ProcessRun(("sh", "-c", "exit 4"), {}, earlier, kill_wait=1.0),
            ProcessRun(("sh", "-c", "exit 5"), {}, tmp_path / "new" / "nested", kill_wait=1.0)]
    with monkeypatch.context() as patched:
        for name in ("mkdir", "makedirs", "unlink", "remove"):
            patched.setattr(os, name, no_file_work)
        for run in runs:
            await run.start()
    ends = [await asyncio.wait_for(run.wait(), 20) for run in runs]
    assert [end.exit_code for end in ends] == [4, 5]
    assert read_status(runs[0].status_file)["exit_code"] == 4


async def test_the_start_hears_the_pid_on_the_pipe_and_reads_no_file(tmp_path):
    run = ProcessRun(("sleep", "5"), {}, tmp_path / "w", kill_wait=0.3)
    run.START_POLL_S = 60.0   # a start that had to poll the status file would take a minute
    await asyncio.wait_for(run.start(), 15)
    assert run._proc.written.result() == {"pid": run.pid}
    assert read_status(run.status_file)["pid"] == run.pid   # the word comes after the file
    await run.stop(0.3)
    end = await asyncio.wait_for(run.wait(), 20)
    assert end.reason == "stopped on request; killed by signal 15" and run._proc.returncode == 128 + 15


async def test_a_workload_that_cannot_start_is_told_on_the_pipe_without_a_pid(tmp_path):
    run = ProcessRun(("/nonexistent/cmd",), {}, tmp_path / "w", kill_wait=0.3)
    with pytest.raises(OSError, match=r"cannot start: \[Errno 2\] No such file or directory: '/nonexistent/cmd'"):
        await asyncio.wait_for(run.start(), 15)
    assert run._proc.written.result() is True   # nothing on the pipe: the file says why


@pytest.mark.parametrize("arg", ['say "hi"\\', "tab\there\nnewline", "ünïcödé ✓", "\x01\x7f"])
def test_the_status_file_holds_any_command_as_json(tmp_path, arg):
    done = subprocess.run([str(native_shim.BINARY), "--kill-wait", "0.5", "--status", str(tmp_path / "s.json"),
                           "--", "sh", "-c", 'exit 6', "sh", arg], capture_output=True, timeout=10)
    assert done.returncode == 6, done.stderr
    status = read_status(tmp_path / "s.json")
    assert status["command"] == ["sh", "-c", "exit 6", "sh", arg]
    assert status["kill_wait"] == 0.5 and isinstance(status["poll"], float) and status["exit_code"] == 6


def test_bytes_that_are_not_utf8_still_leave_a_readable_status(tmp_path):
    done = subprocess.run([os.fsencode(native_shim.BINARY), b"--kill-wait", b"0", b"--status",
                           os.fsencode(tmp_path / "s.json"), b"--", b"true", b"a\xffb"], timeout=10)
    assert done.returncode == 0
    assert read_status(tmp_path / "s.json")["command"] == ["true", "a\ufffdb"]
