"""A job goes from gRPC through the Kafka log to a GPU and back, 300 times."""
from __future__ import annotations

import asyncio

from gpusched.client import Client
from gpusched.workloads import mixed_jobs
from gpusched.local_cluster import LocalCluster
from tests.integration.logcheck import check_log, read_log
from tests.integration.cluster_calls import SUCCEEDED


async def test_300_mixed_jobs_all_succeed_and_the_log_holds_the_invariants(kafka_bootstrap, topics, tmp_path):
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path)
    try:
        admission = await cluster.admission()
        await cluster.placer()
        await asyncio.gather(*(cluster.agent(f"node-{i}") for i in range(4)))
        client = Client(f"127.0.0.1:{admission.port}")
        specs = mixed_jobs(300, seed=7)
        responses = await asyncio.gather(*(client.submit(s) for s in specs))
        job_ids = {r.job.job_id for r in responses}
        assert len(job_ids) == 300

        jobs = await client.wait_terminal(job_ids)
        assert sorted(j.phase for j in jobs) == [SUCCEEDED] * 300, [j.reason for j in jobs if j.phase != SUCCEEDED]
        gangs = [j for j in jobs if j.spec.workers == 2]
        assert gangs and all(len({w.node for w in j.workers}) == 2 for j in gangs)
        await client.close()
    finally:
        await cluster.stop_all()

    report = check_log(await read_log(kafka_bootstrap, topics))
    assert report.violations == []
    assert report.undecodable == 0
    done = {j.job_id: j for j in report.jobs()}
    assert {jid for jid, j in done.items() if j.phase.value == "succeeded"} == job_ids
    assert len(report.placements) >= 300
