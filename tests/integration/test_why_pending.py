"""Why pending, end to end on the real broker: a LocalCluster (admission, placer and
simulated node-agents as processes); a job that cannot fit gets the placer's reason
("0/3 nodes are available: ..."), which GetJob and ``gpusched describe job`` show; once
capacity is freed the job is placed and the reason is gone."""
from __future__ import annotations

import asyncio

from gpusched.client import Client, spec
from gpusched.local_cluster import LocalCluster
from gpusched.v1 import types_pb2
from tests.integration.cli_runs import Cli

# The placer's defaults reserve for the first blocked job (backfill): the reason says so.
NO_FIT = "0/3 nodes are available: 2 not enough free GPUs, 1 cordoned. Capacity is reserved for it (backfill)."


async def first(client: Client, job_id: str, ready) -> types_pb2.Job:
    """The job's first state (current, then each change) for which ``ready`` holds."""
    async for update in client.watch(job_id=job_id):
        if ready(update.job):
            return update.job


async def test_a_job_that_cannot_fit_says_why_until_it_is_placed(kafka_bootstrap, topics, tmp_path):
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path / "logs")
    try:
        admission = await cluster.admission()
        await cluster.placer()
        for name, shape in (("node-0", "4xH100-80GB"), ("node-1", "4xH100-80GB"), ("node-2", "2xA100-80GB")):
            await cluster.agent(name, shape)
        async with Client(f"127.0.0.1:{admission.port}") as client:
            await client.cordon("node-1", "maintenance")
            busy = (await client.submit(spec("busy", "nlp", gpus=3, duration=600, models=("H100-80GB",)))).job
            await asyncio.wait_for(first(client, busy.job_id, lambda j: j.phase == types_pb2.JOB_PHASE_RUNNING), 120)
            waits = (await client.submit(spec("waits", "cv", gpus=4, duration=600))).job.job_id

            pending = await asyncio.wait_for(first(client, waits, lambda j: j.HasField("pending")), 120)
            job = await client.get(waits)   # GetJob answers from admission's own fold
            assert job.phase == types_pb2.JOB_PHASE_PENDING
            assert job.pending == pending.pending
            assert job.pending.kind == types_pb2.PENDING_KIND_NO_FIT and job.pending.summary == NO_FIT
            assert {c.filter: c.nodes for c in job.pending.counts} == {"gpus": 2, "cordoned": 1}
            assert job.pending.nodes == 3 and job.pending_at.seconds > 0

            described = await Cli(admission.port, tmp_path).run("describe", "job", waits)
            assert f"Why pending:  {NO_FIT}" in described and "(no_fit, found " in described

            await client.uncordon("node-1")   # capacity: node-1's 4 GPUs
            placed = await asyncio.wait_for(
                first(client, waits, lambda j: j.phase == types_pb2.JOB_PHASE_RUNNING), 120)
            assert [w.node for w in placed.workers] == ["node-1"]
            job = await client.get(waits)
            assert not job.HasField("pending") and not job.HasField("pending_at")
            assert "Why pending" not in await Cli(admission.port, tmp_path).run("describe", "job", waits)
    finally:
        await cluster.stop_all()
