"""Dependencies with real worker processes (docs/guide/workloads.md, "Dependencies"): a
three-step pipeline submitted at once runs one step after the other, by the workloads'
own records; a step whose dependency failed is cancelled with the reason; a dependency
on an unknown job or another pool's is INVALID_ARGUMENT, on another team's job
PERMISSION_DENIED, and nothing is written for either."""
from __future__ import annotations

import sys
from pathlib import Path

import grpc
import pytest

from gpusched.client import Client, spec
from gpusched.local_cluster import LocalCluster
from gpusched.v1 import types_pb2
from tests.workloads.intervals import read_records

WORKLOADS = Path(__file__).resolve().parents[1] / "workloads"
RECORDER = (sys.executable, str(WORKLOADS / "recorder.py"))
SUCCEEDED, CANCELLED = types_pb2.JOB_PHASE_SUCCEEDED, types_pb2.JOB_PHASE_CANCELLED


def step(name: str, *after: str, exit_code: int = 0, team: str = "ml") -> types_pb2.JobSpec:
    job = spec(name, team, gpus=1, command=(*RECORDER, "--duration", "0.5", "--exit", str(exit_code)))
    job.max_restarts = 0
    for job_id in after:
        job.depends_on.add(job=job_id)
    return job


async def test_a_pipeline_runs_step_after_step_and_a_broken_one_is_cancelled(kafka_bootstrap, topics, tmp_path):
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path / "logs")
    try:
        admission = await cluster.admission()
        await cluster.placer()
        await cluster.agent("node-0", "4xH100-80GB", "--run-processes", "--state-dir", str(tmp_path / "node-0"),
                            "--address", "127.0.0.1")
        client = Client(f"127.0.0.1:{admission.port}")
        prep = (await client.submit(step("prep"))).job.job_id
        train = (await client.submit(step("train", prep))).job.job_id
        evaluate = (await client.submit(step("eval", train))).job.job_id
        broken = (await client.submit(step("broken", exit_code=1))).job.job_id
        after_broken = (await client.submit(step("after-broken", broken))).job.job_id
        waiting = await client.get(evaluate)
        assert waiting.phase == types_pb2.JOB_PHASE_PENDING and waiting.reason == f"waits for job {train}"

        done = {j.job_id: j for j in await client.wait_terminal({prep, train, evaluate, after_broken}, 90)}
        assert [done[j].phase for j in (prep, train, evaluate)] == [SUCCEEDED] * 3
        assert done[after_broken].phase == CANCELLED
        assert done[after_broken].reason == f"dependency never met: job {broken} ended failed, not succeeded"
        runs = {i.job: i for i in read_records(tmp_path)}
        assert runs[prep].last_seen <= runs[train].start and runs[train].last_seen <= runs[evaluate].start
        assert after_broken not in runs

        # bad dependencies: refused naming the field, nothing written
        before = len(await client.list_all())
        for job, code in ((step("x", "job-nobody"), grpc.StatusCode.INVALID_ARGUMENT),
                          (step("y", prep, team="other"), grpc.StatusCode.PERMISSION_DENIED)):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await client.submit(job)
            assert err.value.code() == code and "spec.depends_on[0].job" in err.value.details(), err.value
        assert len(await client.list_all()) == before
        await client.close()
    finally:
        await cluster.stop_all()
