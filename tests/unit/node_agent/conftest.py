"""Every test here runs real processes: whatever a test leaves running (a failing test
stops early) is SIGKILLed at teardown, found through the shim status files."""
from __future__ import annotations

import os
import signal

import pytest

from gpusched_node_agent import native_shim
from gpusched_node_agent.runner import read_status
from gpusched_node_agent.shim import boot_id
from tests.unit.node_agent import procs


@pytest.fixture(params=["python", "native"])
def shim_kind(request, monkeypatch):
    """The test runs with each shim, one contract: the Python shim (``shim.py``, forked by
    the launcher for ProcessRun) and the compiled one (``shim.c``, spawned by the agent)."""
    if request.param == "native" and not native_shim.available():
        pytest.skip("the compiled shim is not built: deploy/setup.sh builds it with a C compiler")
    monkeypatch.setattr(procs, "SHIM_KIND", request.param)
    monkeypatch.setattr(native_shim, "_available", request.param == "native")
    return request.param


@pytest.fixture
def python_shim(monkeypatch):
    """ProcessRun with the Python shim forked by the launcher (what the test is about)."""
    monkeypatch.setattr(native_shim, "_available", False)


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
