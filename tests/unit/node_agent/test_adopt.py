"""A restarted agent takes over the shims an earlier life of it started
(``ProcessRun.adopt``): they are not its children, yet it hears their end, stops them
through them, and reads their checkpoints, as for a shim it spawned itself. The agent's
side (which leftovers it adopts) is tested with real services in
tests/integration/test_real_workloads.py."""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess

from gpusched_node_agent.runner import ProcessRun, group_alive
from tests.polling import eventually
from tests.unit.node_agent.procs import events, recorder, start_orphan_shim

KILL_WAIT = 0.3


def _run(workdir, on_checkpoint=None) -> ProcessRun:
    return ProcessRun(("unused",), {}, workdir, on_checkpoint, kill_wait=KILL_WAIT)


async def test_an_adopted_worker_ends_with_its_workloads_own_code(tmp_path):
    status = start_orphan_shim(tmp_path / "w", recorder("--duration", "0.6", "--exit", "3"))
    assert os.getppid() != status["shim_pid"] and _parent(status["shim_pid"]) != os.getpid()   # not our child
    run = _run(tmp_path / "w")
    assert run.adopt(status)
    end = await asyncio.wait_for(run.wait(), 20)
    assert (end.exit_code, end.signal, end.fenced) == (3, 0, False)
    assert [e["how"] for e in events(tmp_path / "w", "end")] == ["failed"]   # --exit 3
    assert len(events(tmp_path / "w", "start")) == 1          # taken over, never started again


async def test_an_adopted_worker_is_stopped_through_its_shim(tmp_path):
    status = start_orphan_shim(tmp_path / "w", recorder("--duration", "60"), kill_wait=KILL_WAIT)
    eventually(lambda: events(tmp_path / "w", "tick"), "the workload ticking")
    run = _run(tmp_path / "w")
    assert run.adopt(status)
    await run.stop(KILL_WAIT)
    end = await asyncio.wait_for(run.wait(), 20)
    assert (end.exit_code, end.signal) == (143, 0) and end.reason.startswith("stopped on request")
    assert events(tmp_path / "w", "end")[-1]["how"] == "term"
    assert not group_alive(status["pid"])


async def test_an_adopted_worker_reports_the_checkpoints_it_writes(tmp_path):
    status = start_orphan_shim(tmp_path / "w", recorder("--duration", "1.5", "--checkpoint-every", "0.2"))
    saved = []

    async def on_checkpoint(location, progress):
        saved.append(progress)
    run = _run(tmp_path / "w", on_checkpoint)
    assert run.adopt(status)
    assert (await asyncio.wait_for(run.wait(), 20)).exit_code == 0
    assert saved and saved == sorted(saved) and saved[-1] > 0


async def test_a_shim_that_is_gone_or_another_process_now_is_not_adopted(tmp_path):
    status = start_orphan_shim(tmp_path / "w", recorder("--duration", "60"))
    assert not _run(tmp_path / "w").adopt({**status, "shim_start": status["shim_start"] + 1})   # pid reused
    dead = subprocess.Popen(["true"])
    dead.wait()
    assert not _run(tmp_path / "w").adopt({**status, "shim_pid": dead.pid})
    assert not _run(tmp_path / "w").adopt({**status, "pid": None})
    os.kill(status["shim_pid"], signal.SIGTERM)               # clean up: the shim stops its workload
    eventually(lambda: not group_alive(status["pid"]), "the workload gone")


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        text = f.read()
    return int(text[text.rindex(")") + 2:].split()[1])
