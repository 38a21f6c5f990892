"""The shim starts lean: without ``site`` (``-S``), whose .pth files and editable-install
finder cost a third of its start on every job launched."""
from __future__ import annotations

import asyncio

from gpusched_node_agent.runner import ProcessRun


async def test_the_shim_runs_without_site(tmp_path):
    seen = tmp_path / "parent-cmdline"
    # The workload's parent is the shim: its command line is what the agent started.
    run = ProcessRun(("sh", "-c", f"cat /proc/$PPID/cmdline > {seen}"), {}, tmp_path / "work", kill_wait=1.0)
    await run.start()
    end = await asyncio.wait_for(run.wait(), 20)
    assert end.exit_code == 0
    shim_argv = seen.read_bytes().split(b"\0")
    assert shim_argv[1] == b"-S" and shim_argv[2].endswith(b"shim.py"), shim_argv
