"""Job arrays with real worker processes (docs/guide/workloads.md, "Arrays"): an array of
50 tasks, 10 at a time, runs each index once and never more than 10 at once, by the
workloads' own records; the API lists the array with its progress and each task with its
index; cancelling an array stops its running tasks and starts no more; a bad array is
refused naming its field."""
from __future__ import annotations

import sys
from pathlib import Path

import grpc
import pytest

from gpusched.client import Client, spec
from gpusched.local_cluster import LocalCluster
from gpusched.v1 import admission_pb2, types_pb2
from tests.polling import eventually_async
from tests.workloads.intervals import read_records

WORKLOADS = Path(__file__).resolve().parents[1] / "workloads"
RECORDER = (sys.executable, str(WORKLOADS / "recorder.py"))
SUCCEEDED, CANCELLED = types_pb2.JOB_PHASE_SUCCEEDED, types_pb2.JOB_PHASE_CANCELLED


def array_job(name: str, count: int, parallel: int, seconds: float) -> types_pb2.JobSpec:
    """Each task writes the index it was told into its folder, then works."""
    told = f'echo "$GPUSCHED_ARRAY_INDEX" > array_index && exec {RECORDER[0]} {RECORDER[1]} --duration {seconds}'
    job = spec(name, "ml", gpus=1, command=("sh", "-c", told))
    job.array.count, job.array.parallel = count, parallel
    return job


def most_at_once(runs) -> int:
    edges = sorted([(r.start, 1) for r in runs] + [(r.last_seen, -1) for r in runs])
    now = most = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


async def test_an_array_runs_each_task_once_within_its_parallel_bound(kafka_bootstrap, topics, tmp_path):
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path / "logs")
    try:
        admission = await cluster.admission()
        await cluster.placer()
        await cluster.agent("node-0", "16xH100-80GB", "--run-processes", "--state-dir", str(tmp_path / "node-0"),
                            "--address", "127.0.0.1")
        client = Client(f"127.0.0.1:{admission.port}")
        sweep = (await client.submit(array_job("sweep", 50, 10, 0.3))).job.job_id
        [done] = await client.wait_terminal({sweep}, 180)
        assert done.phase == SUCCEEDED, done
        assert (done.array.count, done.array.ended, done.array.failed) == (50, 50, 0)
        tasks = [j for j in await client.list_all() if j.array_of == sweep]
        assert sorted(j.array_index for j in tasks) == list(range(50))
        assert {j.job_id for j in tasks} == {f"{sweep}.{i}" for i in range(50)}
        runs = [r for r in read_records(tmp_path / "node-0") if r.job.startswith(sweep + ".")]
        assert sorted(r.job for r in runs) == sorted(j.job_id for j in tasks)     # each index ran once
        assert most_at_once(runs) <= 10
        told = {p.parent.name.rsplit("-", 2)[0]: p.read_text().strip() for p in (tmp_path / "node-0").glob("*/array_index")}
        assert {j.job_id: str(j.array_index) for j in tasks} == {t: i for t, i in told.items() if t.startswith(sweep)}

        # cancelled half way: its running tasks are stopped, no more start
        slow = (await client.submit(array_job("slow", 20, 2, 30))).job.job_id
        def slow_runs():
            return [r for r in read_records(tmp_path / "node-0") if r.job.startswith(slow + ".")]
        await eventually_async(lambda: len(slow_runs()) == 2, "two of its tasks recorded their start", 60)
        await client.jobs.CancelJob(admission_pb2.CancelJobRequest(job_id=slow, reason="enough"))
        [stopped] = await client.wait_terminal({slow}, 60)
        assert stopped.phase == CANCELLED and stopped.array.ended == 20
        assert len(slow_runs()) == 2      # no third task started

        with pytest.raises(grpc.aio.AioRpcError) as err:
            await client.submit(array_job("bad", 5, 6, 1))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "spec.array.parallel" in err.value.details()
        await client.close()
    finally:
        await cluster.stop_all()
