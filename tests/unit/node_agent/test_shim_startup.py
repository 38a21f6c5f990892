"""The shim starts lean: forked by the agent's launcher, which runs without ``site``
(``-S``, whose .pth files and editable-install finder cost a third of an interpreter's
start) and is started once per agent, not once per job."""
from __future__ import annotations

import asyncio

import pytest

from gpusched_node_agent import launcher
from gpusched_node_agent.runner import ProcessRun

pytestmark = pytest.mark.usefixtures("python_shim")   # the launcher forks the Python shim


async def test_the_shim_is_forked_by_the_launcher_which_runs_without_site(tmp_path):
    runs = [ProcessRun(("sh", "-c", f"cat /proc/$PPID/cmdline > {tmp_path / str(i)}; "
                        f"cut -d' ' -f4 /proc/$PPID/stat > {tmp_path / f'ppid{i}'}"), {}, tmp_path / f"work{i}",
                       kill_wait=1.0) for i in range(2)]
    for run in runs:
        await run.start()
        assert (await asyncio.wait_for(run.wait(), 20)).exit_code == 0
    # The workload's parent is the shim: a fork of the launcher, so the launcher's command line.
    shim_argvs = [(tmp_path / str(i)).read_bytes().split(b"\0") for i in range(2)]
    for argv in shim_argvs:
        assert argv[1] == b"-S" and argv[2].endswith(b"launcher.py"), argv
    one = (await launcher.launcher()).process.pid   # one launcher forked both
    assert [int((tmp_path / f"ppid{i}").read_text()) for i in range(2)] == [one, one]
