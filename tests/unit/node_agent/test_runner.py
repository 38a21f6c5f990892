"""ProcessRun end to end through the shim (real processes), and SimulatedRun's end."""
from __future__ import annotations

import asyncio
import os
import signal

import pytest

from gpusched.core.model import GpuInfo, GpuSlot, NodeInfo, WorkerResources
from gpusched_node_agent.devices import WorkerDevices
from gpusched_node_agent.lease import NodeLease
from gpusched_node_agent.runner import EXIT_TERMINATED, ProcessRun, SimulatedRun, WorkerExit, group_alive
from tests.polling import eventually_async
from tests.unit.node_agent.procs import events, recorder

IDS = {"GPUSCHED_JOB_ID": "job", "GPUSCHED_ATTEMPT": "2", "GPUSCHED_WORKER": "0"}
NODE = NodeInfo("n1", "default", 8_000, 8_000, tuple(GpuInfo(i, f"GPU-{c}", "H100-80GB", 81_559) for i, c in enumerate("ab")))


def gpu(index: int) -> WorkerDevices:
    return WorkerDevices(NODE, (GpuSlot(index),), WorkerResources(gpus=1), False)


def process_run(tmp_path, *args: str, lease: NodeLease | None = None, kill_wait: float = 0.3, on_checkpoint=None):
    run = ProcessRun(tuple(recorder(*args)), {**IDS, "GPUSCHED_RECORD": str(tmp_path / "record.jsonl")},
                     tmp_path / "job-2-0", on_checkpoint, devices=gpu(1),
                     lease_path=lease.path if lease else None, kill_wait=kill_wait)
    run.POLL_S = 0.05
    return run


async def test_start_checkpoint_stop_and_the_real_end(tmp_path):
    seen: list[tuple[str, float]] = []
    checkpointed = asyncio.Event()

    async def on_checkpoint(location: str, progress: float) -> None:
        seen.append((location, progress))
        checkpointed.set()

    lease = NodeLease(tmp_path / "lease")
    lease.renew(1e12)
    run = process_run(tmp_path, "--checkpoint-every", "0.1", lease=lease, on_checkpoint=on_checkpoint)
    await run.start()
    waiting = asyncio.create_task(run.wait())
    await asyncio.wait_for(checkpointed.wait(), 10)
    await run.stop(grace=5)
    end = await asyncio.wait_for(waiting, 10)
    assert end == WorkerExit(EXIT_TERMINATED, 0, False, "stopped on request; exited with code 143")
    assert events(tmp_path, "start")[0]["gpus"] == "GPU-b" and events(tmp_path, "start")[0]["attempt"] == 2
    assert events(tmp_path, "end")[-1]["how"] == "term"
    assert seen[-1][0].startswith("record://job/2/0@") and seen[-1][1] > 0   # the checkpoint taken on SIGTERM
    assert not group_alive(run.pid)


async def test_a_stop_that_comes_while_starting_is_passed_on(tmp_path):
    run = process_run(tmp_path)
    starting = asyncio.create_task(run.start())
    await asyncio.sleep(0)                       # start() is under way, the shim not yet up
    await run.stop(grace=1)
    await starting
    end = await asyncio.wait_for(run.wait(), 10)
    assert end.exit_code == 143 and end.reason.startswith("stopped on request")   # maybe before its handler


async def test_a_relative_workdir_is_used_as_given(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = ProcessRun(tuple(recorder("--duration", "0.05", "--checkpoint-every", "0.01")), {}, "rel/job-0-0",
                     devices=gpu(0))
    await run.start()
    assert (await asyncio.wait_for(run.wait(), 10)).exit_code == 0
    assert sorted(p.name for p in (tmp_path / "rel" / "job-0-0").iterdir()) == ["checkpoint", "output.log",
                                                                               "record.jsonl", "shim.json"]


async def test_a_workload_ignoring_the_stop_is_killed_by_its_shim(tmp_path):
    run = process_run(tmp_path, "--ignore-term")
    await run.start()
    await eventually_async(lambda: events(tmp_path, "tick"), "the first tick", 10.0)
    await run.stop(grace=0.1)
    end = await asyncio.wait_for(run.wait(), 10)
    assert (end.exit_code, end.signal, end.fenced) == (137, signal.SIGKILL, False)
    assert "SIGKILL after kill-wait" in end.reason


async def test_the_lease_running_out_fences_the_run(tmp_path):
    lease = NodeLease(tmp_path / "lease")
    lease.renew(1e12)
    run = process_run(tmp_path, lease=lease)
    await run.start()
    await eventually_async(lambda: events(tmp_path, "tick"), "the first tick", 10.0)
    lease.revoke()
    end = await asyncio.wait_for(run.wait(), 10)
    assert (end.exit_code, end.signal, end.fenced) == (143, 0, True)


async def test_a_normal_exit_is_reported_with_its_code(tmp_path):
    run = process_run(tmp_path, "--duration", "0.1", "--exit", "3")
    await run.start()
    assert await asyncio.wait_for(run.wait(), 10) == WorkerExit(3, 0, False, "exited with code 3")


async def test_a_command_that_cannot_start_raises_oserror(tmp_path):
    run = ProcessRun(("/nonexistent/train",), {}, tmp_path / "w", devices=gpu(0))
    with pytest.raises(OSError, match="cannot start"):
        await run.start()


async def test_an_expired_lease_refuses_the_start(tmp_path):
    lease = NodeLease(tmp_path / "lease")
    lease.revoke()
    run = process_run(tmp_path, lease=lease)
    with pytest.raises(OSError, match="not started: lease expired"):
        await run.start()
    assert events(tmp_path, "start") == []


async def test_a_shim_killed_from_outside_leaves_no_workload_behind(tmp_path):
    run = process_run(tmp_path)
    await run.start()
    await eventually_async(lambda: events(tmp_path, "tick"), "the first tick", 10.0)
    os.kill(run._proc.pid, signal.SIGKILL)
    end = await asyncio.wait_for(run.wait(), 20)
    assert (end.exit_code, end.signal) == (137, signal.SIGKILL)
    assert end.reason.startswith("worker shim killed by signal 9 without recording the end")
    assert not group_alive(run.pid)


async def test_simulated_runs_end_with_the_same_type():
    assert await SimulatedRun(0.01).wait() == WorkerExit(0, reason="exited with code 0")
    run = SimulatedRun(60.0)
    waiting = asyncio.create_task(run.wait())
    await asyncio.sleep(0)
    await run.stop(1.0)
    assert await waiting == WorkerExit(EXIT_TERMINATED, signal.SIGTERM, reason="stopped on request")


@pytest.mark.parametrize("change, field", [
    ({"command": ()}, "command"),
    ({"kill_wait": -1.0}, "kill_wait"),
    ({"kill_wait": float("nan")}, "kill_wait"),
    ({"poll": 0.0}, "poll"),
    ({"kill_wait": "10"}, "kill_wait"),
])
def test_bad_parameters_are_refused_naming_the_field(tmp_path, change, field):
    args = {"command": ("true",), "env": {}, "workdir": tmp_path, "devices": gpu(0),
            **{k: v for k, v in change.items() if k == "command"}}
    with pytest.raises(ValueError, match=field):
        ProcessRun(**args, **{k: v for k, v in change.items() if k != "command"})


async def test_a_run_reads_the_status_file_once_at_its_end_and_never_to_start(tmp_path, monkeypatch):
    """The shim's word on its pipe carries the workload's pid: the start reads nothing,
    the end reads the file once."""
    from gpusched_node_agent import runner
    reads: list[bool] = []
    real = runner.read_status
    monkeypatch.setattr(runner, "read_status", lambda path: reads.append(real(path) is not None) or real(path))
    run = process_run(tmp_path, "--duration", "0.1", "--exit", "0")
    await run.start()
    assert reads == []
    assert run.pid == real(run.status_file)["pid"]
    assert (await asyncio.wait_for(run.wait(), 10)).exit_code == 0
    assert reads == [True]
