"""The worker shim as the agent runs it (``shim_process``): the compiled ``gpusched-shim``
spawned by the agent's own process, its end reaped through a pidfd. Its contract with
the workload (stop, kill deadline, fencing, status file) is tested in test_shim.py,
test_runner.py and test_leftovers.py."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest

from gpusched_node_agent import shim_process
from gpusched_node_agent.proc_info import proc_stat
from gpusched_node_agent.runner import ProcessRun, read_status


def _inheritable(fd: int) -> bool:
    try:
        return os.get_inheritable(fd)
    except OSError:   # listdir's own descriptor, closed by now
        return False


async def test_the_shim_is_the_agents_child_and_the_workloads_parent(tmp_path):
    run = ProcessRun(("sh", "-c", f"cat /proc/$PPID/cmdline > {tmp_path / 'argv'}; "
                      f"cut -d' ' -f4 /proc/$PPID/stat > {tmp_path / 'ppid'}; ls /proc/self/fd > {tmp_path / 'fds'}"),
                     {}, tmp_path / "w", kill_wait=1.0)
    await run.start()
    assert (await asyncio.wait_for(run.wait(), 20)).exit_code == 0
    argv = (tmp_path / "argv").read_bytes().split(b"\0")
    assert argv[0] == os.fsencode(shim_process.BINARY)
    assert int((tmp_path / "ppid").read_text()) == os.getpid()   # spawned by the agent itself
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


async def test_the_start_hears_the_pid_on_the_pipe_and_reads_no_file(tmp_path, monkeypatch):
    from gpusched_node_agent import runner
    monkeypatch.setattr(runner, "read_status", lambda path: pytest.fail("the start read the status file"))
    run = ProcessRun(("sleep", "5"), {}, tmp_path / "w", kill_wait=0.3)
    await asyncio.wait_for(run.start(), 15)
    monkeypatch.undo()
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
    done = subprocess.run([str(shim_process.BINARY), "--kill-wait", "0.5", "--status", str(tmp_path / "s.json"),
                           "--", "sh", "-c", 'exit 6', "sh", arg], capture_output=True, timeout=10)
    assert done.returncode == 6, done.stderr
    status = read_status(tmp_path / "s.json")
    assert status["command"] == ["sh", "-c", "exit 6", "sh", arg]
    assert status["kill_wait"] == 0.5 and isinstance(status["poll"], float) and status["exit_code"] == 6


def test_bytes_that_are_not_utf8_still_leave_a_readable_status(tmp_path):
    done = subprocess.run([os.fsencode(shim_process.BINARY), b"--kill-wait", b"0", b"--status",
                           os.fsencode(tmp_path / "s.json"), b"--", b"true", b"a\xffb"], timeout=10)
    assert done.returncode == 0
    assert read_status(tmp_path / "s.json")["command"] == ["true", "a\ufffdb"]


async def test_many_concurrent_launches_each_get_their_own_end(tmp_path):
    runs = [ProcessRun(("sh", "-c", f"exit {i}"), {}, tmp_path / f"w{i}", kill_wait=1.0) for i in range(40)]
    await asyncio.wait_for(asyncio.gather(*(run.start() for run in runs)), 60)
    ends = await asyncio.wait_for(asyncio.gather(*(run.wait() for run in runs)), 60)
    assert [end.exit_code for end in ends] == list(range(40))
    assert len({read_status(run.status_file)["shim_pid"] for run in runs}) == 40


async def test_the_workload_gets_exactly_the_environment_of_its_run(tmp_path, monkeypatch):
    """The run's environment is the agent's, with the run's variables set or changed, and
    the checkpoint and usage files: nothing else reaches the workload."""
    monkeypatch.setenv("GPUSCHED_TEST_CHANGED", "before")
    out = tmp_path / "env"
    run = ProcessRun(("sh", "-c", f"env > {out}"), {"GPUSCHED_TEST_CHANGED": "after", "GPUSCHED_TEST_JOBS_OWN": "job"},
                     tmp_path / "w", kill_wait=1.0)
    await run.start()
    assert (await asyncio.wait_for(run.wait(), 20)).exit_code == 0
    set_by_sh = ("PWD", "SHLVL", "_", "OLDPWD")
    got = {k: v for k, v in (line.split("=", 1) for line in out.read_text().splitlines()) if k not in set_by_sh}
    assert got == {k: v for k, v in run.env.items() if k not in set_by_sh} and got["GPUSCHED_TEST_CHANGED"] == "after" and got["GPUSCHED_TEST_JOBS_OWN"] == "job"


async def test_a_run_that_changes_path_finds_its_command_there(tmp_path):
    """The shim looks the command up in the PATH of the run's environment (its own)."""
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "gpusched-test-tool").write_text("#!/bin/sh\necho found > found\n")
    (tools / "gpusched-test-tool").chmod(0o755)
    run = ProcessRun(("gpusched-test-tool",), {"PATH": f"{tools}:{os.environ['PATH']}"}, tmp_path / "w",
                     kill_wait=1.0)
    await run.start()
    assert (await asyncio.wait_for(run.wait(), 20)).exit_code == 0
    assert (tmp_path / "w" / "found").read_text() == "found\n"


async def test_the_status_records_the_shims_own_start(tmp_path):
    """What leftovers.py checks a live shim's pid against: its start in clock ticks."""
    run = ProcessRun(("sleep", "5"), {}, tmp_path / "w", kill_wait=0.3)
    await asyncio.wait_for(run.start(), 15)
    status = read_status(run.status_file)
    assert status["shim_start"] == proc_stat(status["shim_pid"])[1] == proc_stat(run._proc.pid)[1]
    await run.stop(0.3)
    await asyncio.wait_for(run.wait(), 20)


async def test_without_the_binary_a_start_fails_naming_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setattr(shim_process, "BINARY", tmp_path / "gpusched-shim")
    run = ProcessRun(("true",), {}, tmp_path / "w", kill_wait=0.3)
    with pytest.raises(OSError, match=r"the worker shim .*gpusched-shim is not built: install a C compiler"):
        await run.start()


def test_runner_loaded_by_file_path_runs_a_workload_through_the_shim(tmp_path):
    """deploy/gpu_check.py loads runner.py by its path, the package not installed (-S:
    no site-packages): it finds shim_process.py and the shim beside it."""
    script = ("import asyncio, importlib.util, sys\n"
              f"spec = importlib.util.spec_from_file_location('runner', {str(shim_process.BINARY.with_name('runner.py'))!r})\n"
              "runner = sys.modules['runner'] = importlib.util.module_from_spec(spec)\n"
              "spec.loader.exec_module(runner)\n"
              "async def main():\n"
              f"    run = runner.ProcessRun(('sh', '-c', 'exit 4'), {{}}, {str(tmp_path / 'w')!r}, kill_wait=1.0)\n"
              "    await run.start()\n"
              "    return (await run.wait()).exit_code\n"
              "sys.exit(asyncio.run(main()))\n")
    assert subprocess.run([sys.executable, "-I", "-S", "-c", "import gpusched_node_agent"],
                          capture_output=True, timeout=10).returncode != 0
    done = subprocess.run([sys.executable, "-I", "-S", "-c", script], capture_output=True, text=True, timeout=30)
    assert done.returncode == 4, done.stderr
