"""kill_leftovers with real processes: live shims are stopped through the shim (which
records the real end), orphaned workloads directly, ended workers are ignored, and pids
from another boot or that are gone are never signalled."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from gpusched.core.model import EXIT_LOST
from gpusched_node_agent import leftovers
from gpusched_node_agent.leftovers import WorkerDir, kill_leftovers, parse_worker_dir, worker_dir_name
from gpusched_node_agent.runner import group_alive, read_status
from gpusched_node_agent.proc_info import boot_id, proc_start
from tests.polling import eventually
from tests.unit.node_agent.procs import ended_status, events, pid_alive, recorder, start_shim

KILL_WAIT = 0.3



def _running(path, *args):
    shim = start_shim(path, recorder(*args), kill_wait=KILL_WAIT)
    eventually(lambda: events(path, "tick"), f"{path.name} ticking")
    return shim


def _fake_status(path, **fields):
    path.mkdir()
    (path / "shim.json").write_text(json.dumps({"shim_pid": None, "pid": None, "started_at": 1.0, **fields}))


def test_live_workers_are_ended_and_reported_and_ended_ones_ignored(tmp_path):
    graceful = _running(tmp_path / "job-a-0-0")
    stubborn = _running(tmp_path / "job-b-1-0", "--ignore-term")
    orphan_shim = _running(tmp_path / "job-d-2-1")
    finished = start_shim(tmp_path / "job-c-0-0", recorder("--duration", "0.05"))
    assert finished.wait(10) == 0
    orphan_shim.kill()                                       # its workload runs on, unfenced
    orphan_shim.wait(10)
    dead = subprocess.Popen(["true"])
    dead.wait()
    _fake_status(tmp_path / "job-e-0-0", shim_pid=dead.pid, pid=dead.pid, boot_id=boot_id())
    me = os.getpid()                                         # a live pid, recorded in another boot
    _fake_status(tmp_path / "other", shim_pid=me, pid=me, boot_id="an-earlier-boot")
    pids = {d: read_status(tmp_path / d / "shim.json")["pid"] for d in ("job-a-0-0", "job-b-1-0", "job-d-2-1")}

    started = time.monotonic()
    found = {w.name: w for w in kill_leftovers(tmp_path, KILL_WAIT)}
    assert time.monotonic() - started < KILL_WAIT + 3.0      # stopped side by side, not one after another

    assert sorted(found) == ["job-a-0-0", "job-b-1-0", "job-d-2-1", "job-e-0-0", "other"]
    a, b, d = found["job-a-0-0"], found["job-b-1-0"], found["job-d-2-1"]
    assert (a.end.exit_code, a.end.signal, a.gone) == (143, 0, True)
    assert a.end.reason.startswith("stopped on request") and a.key == WorkerDir("job-a", 0, 0)
    assert (b.end.exit_code, b.end.signal) == (137, signal.SIGKILL)
    assert (d.end.exit_code, d.end.signal) == (143, signal.SIGTERM) and "no shim" in d.end.reason
    assert d.key == WorkerDir("job-d", 2, 1)
    assert found["job-e-0-0"].end.exit_code == EXIT_LOST and found["other"].end.exit_code == EXIT_LOST
    assert found["other"].key is None and pid_alive(me)
    for name, pid in pids.items():
        assert not group_alive(pid), name
    assert events(tmp_path / "job-a-0-0", "end")[-1]["how"] == "term"
    graceful.wait(10)
    stubborn.wait(10)

    assert kill_leftovers(tmp_path, KILL_WAIT) == []         # every end is recorded now
    assert ended_status(tmp_path / "job-d-2-1")["signal"] == signal.SIGTERM


def test_a_frozen_shim_is_killed_with_its_workload_after_the_deadline(tmp_path):
    shim = _running(tmp_path / "job-f-0-0")
    pid = read_status(tmp_path / "job-f-0-0" / "shim.json")["pid"]
    shim.send_signal(signal.SIGSTOP)                        # it can no longer forward the stop
    [w] = kill_leftovers(tmp_path, KILL_WAIT)
    assert (w.end.exit_code, w.end.signal, w.gone) == (137, signal.SIGKILL, True)
    assert shim.wait(10) == -signal.SIGKILL and not group_alive(pid)


def test_a_pid_reused_by_another_process_is_not_signalled(tmp_path):
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        eventually(lambda: proc_start(victim.pid), "the stand-in process")
        # a shim and workload that once had this pid, but started at another time
        _fake_status(tmp_path / "job-0-0", shim_pid=victim.pid, shim_start=proc_start(victim.pid) - 1,
                     pid=None, boot_id=boot_id())
        [w] = kill_leftovers(tmp_path, KILL_WAIT)
        assert w.end.exit_code == EXIT_LOST and victim.poll() is None
    finally:
        victim.kill()
        victim.wait()


def test_an_empty_or_missing_state_dir_has_no_leftovers(tmp_path):
    assert kill_leftovers(tmp_path, KILL_WAIT) == []
    assert kill_leftovers(tmp_path / "absent", KILL_WAIT) == []
    with pytest.raises(ValueError, match="kill_wait"):
        kill_leftovers(tmp_path, -1.0)


@pytest.mark.parametrize("name, expected", [
    ("job-1-2", WorkerDir("job", 1, 2)),
    ("my-job-x-3-0", WorkerDir("my-job-x", 3, 0)),
    (worker_dir_name("a-b", 10, 7), WorkerDir("a-b", 10, 7)),
])
def test_worker_dir_names_parse(name, expected):
    assert parse_worker_dir(name) == expected


@pytest.mark.parametrize("name, message", [
    ("job-1", "expected <job_id>-<attempt>-<worker>"),
    ("-1-2", "expected <job_id>-<attempt>-<worker>"),
    ("job-a-0", "attempt 'a'"),
    ("job-1-b", "worker 'b'"),
    ("job-1--2", "attempt ''"),
])
def test_bad_worker_dir_names_are_refused_naming_the_part(name, message):
    with pytest.raises(ValueError, match=message):
        parse_worker_dir(name)


def test_a_process_still_there_after_sigkill_is_not_gone_and_its_end_not_recorded(tmp_path, monkeypatch):
    """The liveness probe stands in for a process in uninterruptible sleep."""
    monkeypatch.setattr(leftovers, "MARGIN_S", 0.2)
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        _fake_status(tmp_path / "job-s-0-0", pid=proc.pid, boot_id=boot_id())
        [w] = kill_leftovers(tmp_path, KILL_WAIT, alive=lambda pgid: pgid == proc.pid or group_alive(pgid))
        assert (w.gone, w.end.signal) == (False, signal.SIGKILL) and "after SIGKILL" in w.end.reason
        assert "ended_at" not in read_status(tmp_path / "job-s-0-0" / "shim.json")   # the next agent looks again
        assert proc.wait(10) == -signal.SIGTERM   # it really ended: only the probe says it is there
    finally:
        proc.kill()
        proc.wait()
