"""The placer's bound on a cycle's time (``--max-cycle-ms``, Slurm's max_sched_time), on
the real broker: with a bound every cycle passes at once, each cycle takes
``--min-job-test`` jobs and stops, the next continues, and every job of a backlog larger
than one cycle is placed. The placer's ``--cycle-log`` gives each cycle's pending and
placed jobs."""
from __future__ import annotations

from gpusched.client import Client, spec
from gpusched.local_cluster import LocalCluster
from gpusched_placer import cycle_log
from tests.integration.cluster_calls import all_running

MIN_JOB_TEST, JOBS = 12, 96


async def test_a_bounded_cycle_stops_at_min_job_test_and_the_next_continues(kafka_bootstrap, topics, tmp_path):
    cycles = tmp_path / "cycles.log"
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path / "logs")
    try:
        admission = await cluster.admission()
        await cluster.node_host("h1", 16, "8xH100-80GB", "--heartbeat-interval", "0.5")   # 128 GPUs
        await cluster.placer("placer", "--max-cycle-ms", "0.001", "--min-job-test", str(MIN_JOB_TEST),
                             "--job-test-head", "4", "--cycle-log", str(cycles))
        async with Client(f"127.0.0.1:{admission.port}") as client:
            results = await client.submit_many([(spec(f"j{i}", "t", gpus=1, duration=600), "") for i in range(JOBS)])
            ids = {r.job.job_id for r in results}
            await all_running(client, ids, timeout=180)
        lines = cycle_log.read(str(cycles))
        assert sum(c["placed"] for c in lines) == JOBS
        # A cycle that met more waiting jobs than min_job_test was cut there (every job fits).
        assert any(c["pending"] > MIN_JOB_TEST for c in lines)
        assert max(c["placed"] for c in lines) == MIN_JOB_TEST
    finally:
        await cluster.stop_all()
