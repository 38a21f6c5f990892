"""The preemptor service runs the actions ``--actions`` names, in that order
(gpusched.policies.actions; the unit tests show what each order decides)."""
from __future__ import annotations

from gpusched.client import Client, spec
from gpusched.core import events as ev
from gpusched.local_cluster import LocalCluster
from gpusched.v1 import admission_pb2
from tests.integration.logcheck import check_log, read_log
from tests.integration.cluster_calls import all_running, events_of


async def test_defrag_before_preempt_moves_a_job_where_the_default_order_would_stop_one(
        kafka_bootstrap, topics, tmp_path):
    # A higher-priority whole-node job in a pool fragmented by two lower-priority
    # checkpointable jobs: the default order (preempt before defrag) stops one of them for
    # priority; defrag first moves one of them instead.
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path)
    try:
        admission = await cluster.admission()
        await cluster.placer()
        await cluster.preemptor("preemptor", "--min-runtime", "0", "--max-loss-per-wait", "inf", "--actions", "nodes,attempts,defrag,preempt")
        await cluster.agent("node-0", "8xH100-80GB", "--grace", "2")
        client = Client(f"127.0.0.1:{admission.port}")
        work = {"duration": 20.0, "checkpoint_interval": 1.0, "priority": "training"}
        # Each job placed while only one node fits it, whatever the placement policy.
        a = (await client.submit(spec("a", "ops", gpus=4, **work))).job.job_id
        await all_running(client, {a})
        hog = (await client.submit(spec("hog", "ops", gpus=4, duration=60.0, preemptible=False))).job.job_id
        await all_running(client, {hog})                          # beside a, on node-0 (the only node)
        await cluster.agent("node-1", "8xH100-80GB", "--grace", "2")
        b = (await client.submit(spec("b", "ops", gpus=4, **work))).job.job_id
        await all_running(client, {b})                            # node-1 (node-0 is full)
        await client.jobs.CancelJob(admission_pb2.CancelJobRequest(job_id=hog))
        await client.wait_terminal({hog}, timeout=30)   # its GPUs free: 4 on each node
        big = (await client.submit(spec("big", "ops", gpus=8, duration=1.0, priority="training-high"))).job
        await all_running(client, {big.job_id}, timeout=60)
        await client.close()
    finally:
        await cluster.stop_all()
    log = await read_log(kafka_bootstrap, topics)
    assert check_log(log).violations == []
    preempted = [e for e in events_of(log) if isinstance(e, ev.JobPreempted)]
    assert preempted and {e.job_id for e in preempted} <= {a, b}
    assert all(e.reason.startswith("defragmentation") for e in preempted), [e.reason for e in preempted]
