"""Every test here runs real processes: whatever a test leaves running (a failing test
stops early) is SIGKILLed at teardown, found through the shim status files."""
from __future__ import annotations

import os
import signal

import pytest

from gpusched_node_agent.proc_info import boot_id
from gpusched_node_agent.runner import read_status


@pytest.fixture(autouse=True)
def no_workers_left(tmp_path):
    yield
    for path in tmp_path.rglob("shim.json"):
        status = read_status(path) or {}
        if "ended_at" in status or status.get("boot_id") != boot_id():
            continue
        for pid, kill in ((status.get("pid"), os.killpg), (status.get("shim_pid"), os.kill)):
            if isinstance(pid, int) and pid > 1 and pid != os.getpid():
                try:
                    kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
