"""Topology domains with real services and worker processes (docs/guide/workloads.md,
"Topology"): on agents labelled by rack, a gang that requires one rack waits, with a
why-pending reason naming the level, while the same gang without the requirement runs
across racks; once a rack has room for every worker, it runs there, by the workloads'
own records; a request naming a level the pool lacks is INVALID_ARGUMENT."""
from __future__ import annotations

import sys
from pathlib import Path

import grpc
import pytest

from gpusched.client import Client, spec
from gpusched.local_cluster import LocalCluster
from gpusched.v1 import types_pb2
from tests.integration.cluster_calls import until
from tests.workloads.intervals import read_records

WORKLOADS = Path(__file__).resolve().parents[1] / "workloads"
RECORDER = (sys.executable, str(WORKLOADS / "recorder.py"))
SUCCEEDED, TOPOLOGY = types_pb2.JOB_PHASE_SUCCEEDED, types_pb2.PENDING_KIND_TOPOLOGY
RACK = {"a0": "r1", "a1": "r1", "b0": "r2", "b1": "r2", "b2": "r2"}


def gang(name: str, required: str = "") -> types_pb2.JobSpec:
    job = spec(name, "ml", gpus=2, workers=3, command=(*RECORDER, "--duration", "0.5"))
    if required:
        job.topology.required = required
    return job


async def test_a_gang_requiring_a_rack_waits_for_one_and_runs_inside_it(kafka_bootstrap, topics, tmp_path):
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path / "logs")

    async def agent(name: str) -> None:
        await cluster.agent(name, "2xH100-80GB", "--run-processes", "--state-dir", str(tmp_path / name),
                            "--address", "127.0.0.1", "--label", f"rack={RACK[name]}")

    try:
        admission = await cluster.admission()
        await cluster.placer()
        for name in ("a0", "a1", "b0"):
            await agent(name)
        client = Client(f"127.0.0.1:{admission.port}")
        summary = await client.set_pool_topology("default", ["rack"])
        assert list(summary.topology_levels) == ["rack"]

        with pytest.raises(grpc.aio.AioRpcError) as err:
            await client.submit(gang("nowhere", required="block"))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "spec.topology.required" in err.value.details()

        racked = (await client.submit(gang("racked", required="rack"))).job.job_id
        loose = (await client.submit(gang("loose"))).job.job_id
        (done,) = await client.wait_terminal({loose}, 60)
        assert done.phase == SUCCEEDED
        assert {RACK[w.node] for w in done.workers} == {"r1", "r2"}     # it ran across the racks
        waiting = await until(client, lambda j: j.pending.kind == TOPOLOGY, 60, job_id=racked)
        assert waiting.phase == types_pb2.JOB_PHASE_PENDING
        assert "no rack has room for 3 workers" in waiting.pending.summary

        for name in ("b1", "b2"):   # rack r2 now has three nodes
            await agent(name)
        (done,) = await client.wait_terminal({racked}, 60)
        assert done.phase == SUCCEEDED
        assert sorted(w.node for w in done.workers) == ["b0", "b1", "b2"]
        # The workloads' own records: each worker ran on a node of rack r2, none elsewhere.
        ran = {name for name in RACK if any(i.job == racked for i in read_records(tmp_path / name))}
        assert ran == {"b0", "b1", "b2"}
        await client.close()
    finally:
        await cluster.stop_all()
