"""Real devices end to end, on a fake NVML: node-agent processes started with
``--fake-nvml`` register their GPUs' MIG mode; jobs submitted through admission run real
commands that record their environment: a MIG job sees its instance's ``MIG-...`` UUID,
a share with a GPU-memory request gets MPS limits, and with ``--dynamic-mig`` the agent
creates the instance before the command and destroys it after."""
from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import grpc
import pytest

from gpusched.client import Client, spec
from gpusched.local_cluster import LocalCluster
from gpusched.v1 import admission_pb2, cluster_pb2, types_pb2
from tests.polling import eventually_async
from tests.unit.adapters.mig_specs import h200, mig_node

SUCCEEDED = types_pb2.JOB_PHASE_SUCCEEDED


def record_env(path: Path) -> tuple[str, ...]:
    """A real command writing the environment it was given to ``path``."""
    code = f"import json, os; json.dump(dict(os.environ), open({str(path)!r}, 'w'))"
    return (sys.executable, "-c", code)


async def finished(client: Client, job_id: str, timeout: float = 90.0) -> types_pb2.Job:
    stream = client.jobs.WatchJobs(admission_pb2.WatchJobsRequest())

    async def follow():
        async for update in stream:
            if update.job.job_id == job_id and update.job.phase in (SUCCEEDED, types_pb2.JOB_PHASE_FAILED):
                return update.job
    try:
        return await asyncio.wait_for(follow(), timeout)
    finally:
        stream.cancel()


async def registered(client: Client, name: str, timeout: float = 30.0):
    """The node as admission's state has it, once its registration is applied there."""
    return await eventually_async(   # admission follows the log on its own: poll its view
        lambda: client.cluster.GetNode(cluster_pb2.GetNodeRequest(name=name)), f"{name} registered", timeout,
        poll=0.2, ignoring=(Exception,))


async def run_job(client: Client, job_spec, out: Path) -> dict:
    job = (await client.submit(job_spec)).job
    assert job.job_id, job
    done = await finished(client, job.job_id)
    assert done.phase == SUCCEEDED, done.reason
    return json.loads(out.read_text())


async def test_mig_and_share_jobs_get_their_devices(kafka_bootstrap, topics, tmp_path):
    nvml = tmp_path / "nvml.json"
    nvml.write_text(json.dumps(mig_node()))
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path / "logs")
    try:
        admission = await cluster.admission()
        await cluster.placer()
        await cluster.start("agent-mig", "gpusched-node-agent", "--name", "mig-node", "--fake-nvml", str(nvml),
                            "--mps", "on")
        client = Client(f"127.0.0.1:{admission.port}")
        node = await registered(client, "mig-node")
        on, off = node.info.gpus
        assert not node.info.simulated and node.info.mps
        assert on.mig_mode == types_pb2.MIG_MODE_ENABLED and off.mig_mode == types_pb2.MIG_MODE_DISABLED
        assert [(m.profile, m.start, m.uuid) for m in on.mig_instances] == [
            ("3g.71gb", 0, "MIG-3g-a"), ("1g.18gb", 4, "MIG-1g-b")]
        assert {p.name for p in on.mig_profiles} >= {"1g.18gb", "3g.71gb", "7g.141gb"}

        env = await run_job(client, spec("mig3", "t", mig="3g", command=record_env(tmp_path / "mig3.json")),
                            tmp_path / "mig3.json")
        assert env["CUDA_VISIBLE_DEVICES"] == "MIG-3g-a"
        env = await run_job(client, spec("mig1", "t", mig="1g", command=record_env(tmp_path / "mig1.json")),
                            tmp_path / "mig1.json")
        assert env["CUDA_VISIBLE_DEVICES"] == "MIG-1g-b"

        share = spec("share", "t", gpu_milli=250, gpu_memory_mib=20_000, command=record_env(tmp_path / "share.json"))
        env = await run_job(client, share, tmp_path / "share.json")
        assert env["CUDA_VISIBLE_DEVICES"] == "GPU-1"   # GPU 0 has MIG on: no shares there
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20000M"

        # a share asking more GPU memory than the pool's GPUs have: refused at submit
        big = spec("big", "t", gpu_milli=250, gpu_memory_mib=200_000)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await client.submit(big)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert refused.value.details().startswith("spec.resources.gpu_memory_mib:")
        await client.close()
    finally:
        await cluster.stop_all()


async def test_dynamic_mig_creates_and_destroys_instances(kafka_bootstrap, topics, tmp_path):
    journal = tmp_path / "nvml.log"
    nvml = tmp_path / "nvml.json"
    nvml.write_text(json.dumps({"gpus": [h200("GPU-d0")], "journal": str(journal)}))
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path / "logs")
    try:
        admission = await cluster.admission()
        await cluster.placer()
        await cluster.start("agent-dyn", "gpusched-node-agent", "--name", "dyn-node", "--pool", "dyn",
                            "--fake-nvml", str(nvml), "--dynamic-mig", "--mps", "off")
        client = Client(f"127.0.0.1:{admission.port}")
        node = await registered(client, "dyn-node")
        assert node.info.dynamic_mig and not node.info.gpus[0].mig_instances

        env = await run_job(client, spec("dyn2g", "t", mig="2g", pool="dyn", command=record_env(tmp_path / "d.json")),
                            tmp_path / "d.json")
        uuid = env["CUDA_VISIBLE_DEVICES"]
        assert uuid.startswith("MIG-")
        steps = [line.split()[0] for line in journal.read_text().splitlines()]
        # made before the command ran, gone before its end was reported
        assert steps == ["create-gi", "create-ci", "destroy-ci", "destroy-gi"]
        assert uuid in journal.read_text()
        await client.close()
    finally:
        await cluster.stop_all()
