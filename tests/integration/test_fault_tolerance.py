"""Issue 4 end to end: priority preemption with checkpoints, node loss, GPU faults."""
from __future__ import annotations

import asyncio

from gpusched.core.model import NodeStatus
from gpusched.client import Client, spec
from gpusched.core import events as ev
from gpusched.local_cluster import LocalCluster
from gpusched.v1 import admission_pb2, cluster_pb2, node_agent_pb2, node_agent_pb2_grpc, types_pb2
from tests.integration.logcheck import check_log, read_log

import grpc
from tests.integration.cluster_calls import RUNNING, until, all_running, events_of, until_node

SUCCEEDED = types_pb2.JOB_PHASE_SUCCEEDED


def work_lost_per_preemption(events: list[ev.Event], victims: set[str]) -> list[float]:
    """For each preempted attempt: run time minus the progress its checkpoints covered."""
    started, progress_at_start, best, lost = {}, {}, {}, []
    for e in events:
        if isinstance(e, ev.WorkerStarted) and e.job_id in victims and e.worker == 0:
            started[(e.job_id, e.attempt)] = e.time
            progress_at_start[(e.job_id, e.attempt)] = best.get(e.job_id, 0.0)
        elif isinstance(e, ev.CheckpointSaved) and e.job_id in victims:
            best[e.job_id] = max(best.get(e.job_id, 0.0), e.progress_s)
        elif isinstance(e, ev.WorkerFinished) and e.job_id in victims and e.worker == 0 and e.exit_code != 0:
            key = (e.job_id, e.attempt)
            ran = e.time - started[key]
            covered = best.get(e.job_id, 0.0) - progress_at_start[key]
            lost.append(ran - covered)
    return lost


async def test_priority_preemption_checkpoints_victims_and_they_resume(kafka_bootstrap, topics, tmp_path):
    interval = 1.0
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path)
    try:
        admission = await cluster.admission()
        await cluster.placer()
        await cluster.preemptor("preemptor", "--min-runtime", "0", "--max-loss-per-wait", "inf")
        await asyncio.gather(*(cluster.agent(f"node-{i}", "8xH100-80GB", "--grace", "5") for i in range(2)))
        client = Client(f"127.0.0.1:{admission.port}")
        filler = [spec(f"be-{i}", "research", gpus=1, duration=8.0, priority="best-effort",
                       checkpoint_interval=interval) for i in range(16)]
        ids = {(await client.submit(s)).job.job_id for s in filler}
        await all_running(client, ids)

        urgent = (await client.submit(spec("urgent", "prod", gpus=8, duration=2.0, priority="training-high"))).job
        ran = await until(client, lambda j: j.job_id == urgent.job_id and j.phase in (RUNNING, SUCCEEDED), 60)
        assert ran.phase in (RUNNING, SUCCEEDED)

        jobs = await client.wait_terminal(ids | {urgent.job_id}, timeout=180)
        assert {j.phase for j in jobs} == {SUCCEEDED}
        victims = {j.job_id for j in jobs if j.preemptions > 0}
        assert len(victims) >= 8
        assert all(j.checkpoint for j in jobs if j.job_id in victims)
        await client.close()
    finally:
        await cluster.stop_all()
    log = await read_log(kafka_bootstrap, topics)
    report = check_log(log)
    assert report.violations == []
    lost = work_lost_per_preemption(events_of(log), victims)
    assert len(lost) >= len(victims)
    assert max(lost) <= interval, lost


async def test_killed_node_agent_its_jobs_resume_elsewhere_from_checkpoints(kafka_bootstrap, topics, tmp_path):
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path)
    try:
        admission = await cluster.admission()
        await cluster.placer()
        await cluster.preemptor("preemptor", "--heartbeat-timeout", "3")
        doomed = await cluster.agent("node-0", "8xH100-80GB", "--heartbeat-interval", "0.5")
        client = Client(f"127.0.0.1:{admission.port}")
        jobs = [spec(f"train-{i}", "llm", gpus=2, duration=6.0, checkpoint_interval=1.0) for i in range(4)]
        ids = {(await client.submit(s)).job.job_id for s in jobs}
        await all_running(client, ids)
        await cluster.agent("node-1", "8xH100-80GB", "--heartbeat-interval", "0.5")
        # Let every job save a checkpoint, then pull the plug on node-0.
        saved: set[str] = set()

        def all_saved(job) -> bool:
            if job.job_id in ids and job.checkpoint:
                saved.add(job.job_id)
            return saved == ids
        await until(client, all_saved, 30)
        await doomed.kill9()

        done = await client.wait_terminal(ids, timeout=120)
        assert {j.phase for j in done} == {SUCCEEDED}
        assert all({w.node for w in j.workers} == {"node-1"} for j in done)
        assert all(j.attempt >= 1 and j.checkpoint for j in done)
        nodes = {n.info.name: n.status for n in await client.nodes()}
        assert nodes["node-0"] == types_pb2.NODE_STATUS_LOST
        await client.close()
    finally:
        await cluster.stop_all()
    log = await read_log(kafka_bootstrap, topics)
    report = check_log(log)
    assert report.violations == []
    resumed = [e for e in events_of(log) if isinstance(e, ev.NodeLost) and e.node == "node-0"]
    assert len(resumed) == 1


async def test_gpu_fault_excludes_gpu_moves_job_and_repeated_fault_quarantines(kafka_bootstrap, topics, tmp_path):
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path)
    try:
        admission = await cluster.admission()
        await cluster.placer()
        sick = await cluster.agent("node-0", "2xA100-80GB")
        await cluster.agent("node-1", "2xA100-80GB")
        client = Client(f"127.0.0.1:{admission.port}")
        job = (await client.submit(spec("victim", "cv", gpus=1, duration=30.0))).job
        job = await until(client, lambda j: j.job_id == job.job_id and j.phase == RUNNING)
        node, gpu = job.workers[0].node, job.workers[0].gpus[0].index
        agent = sick if node == "node-0" else next(s for s in cluster.services if s.name == f"agent-{node}")
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{agent.port}")
        nvml = node_agent_pb2_grpc.NodeAgentServiceStub(channel)
        await nvml.InjectGpuFault(node_agent_pb2.InjectGpuFaultRequest(gpu_index=gpu, xid=79))

        moved = await until(client, lambda j: j.job_id == job.job_id and j.attempt == 1 and j.phase == RUNNING)
        assert (moved.workers[0].node, moved.workers[0].gpus[0].index) != (node, gpu)
        info = await client.cluster.GetNode(cluster_pb2.GetNodeRequest(name=node))
        assert not info.gpus[gpu].healthy and info.status == types_pb2.NODE_STATUS_READY

        await nvml.InjectGpuFault(node_agent_pb2.InjectGpuFaultRequest(gpu_index=1 - gpu, ecc=True))
        quarantined = await until_node(kafka_bootstrap, topics, node, NodeStatus.CORDONED)
        assert not any(g.healthy for g in quarantined.gpus)
        cleared = await client.cluster.UncordonNode(cluster_pb2.UncordonNodeRequest(name=node))
        assert cleared.status == types_pb2.NODE_STATUS_READY and all(g.healthy for g in cleared.gpus)
        await channel.close()
        await client.close()
    finally:
        await cluster.stop_all()
    assert check_log(await read_log(kafka_bootstrap, topics)).violations == []


QUOTAS = {"orgs": {"ml": {"teams": {"team-a": {"guaranteed_gpus": 8}, "team-b": {"guaranteed_gpus": 8}}}}}


def _times(events, cls, ids) -> dict[str, float]:
    out: dict[str, float] = {}
    for e in events:
        if isinstance(e, cls) and e.job_id in ids:
            out.setdefault(e.job_id, e.time)
    return out


async def test_quota_reclaim_gives_a_team_its_guarantee_back(kafka_bootstrap, topics, tmp_path):
    grace = 2.0
    quotas = tmp_path / "quotas.json"
    quotas.write_text(__import__("json").dumps(QUOTAS))
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path)
    try:
        admission = await cluster.admission("admission", 0, "--quotas", str(quotas))   # a bootstrap
        await cluster.placer("placer")
        await cluster.preemptor("preemptor", "--min-runtime", "0", "--max-loss-per-wait", "inf", "--reclaim-min-runtime", "0")
        await asyncio.gather(*(cluster.agent(f"node-{i}", "8xH100-80GB", "--grace", str(grace)) for i in range(2)))
        client = Client(f"127.0.0.1:{admission.port}")
        # Team A takes the whole cluster while B is idle: 8 GPUs of it are borrowed.
        a_ids = {(await client.submit(spec(f"a-{i}", "team-a", gpus=2, duration=6.0, checkpoint_interval=1.0)))
                 .job.job_id for i in range(8)}
        await all_running(client, a_ids)
        b_ids = {(await client.submit(spec(f"b-{i}", "team-b", gpus=2, duration=1.0))).job.job_id for i in range(4)}
        await all_running(client, b_ids, timeout=60)
        jobs = await client.wait_terminal(a_ids | b_ids, timeout=120)
        assert {j.phase for j in jobs} == {SUCCEEDED}
        reclaimed = [j for j in jobs if j.job_id in a_ids and j.preemptions]
        assert len(reclaimed) == 4              # exactly B's guarantee came back, no more
        await client.close()
    finally:
        await cluster.stop_all()
    log = await read_log(kafka_bootstrap, topics)
    assert check_log(log).violations == []
    events = events_of(log)
    submitted = _times(events, ev.JobSubmitted, b_ids)
    started = _times(events, ev.WorkerStarted, b_ids)
    waited = [started[j] - submitted[j] for j in b_ids]
    # One scheduling cycle (well under a second here) plus the victims' grace period.
    assert max(waited) <= grace + 2.0, waited
    preempted = [e for e in events if isinstance(e, ev.JobPreempted)]
    assert preempted and all(e.job_id in a_ids and "reclaim" in e.reason for e in preempted)


async def test_defragmentation_migrates_checkpointable_jobs_to_fit_a_whole_node_job(kafka_bootstrap, topics, tmp_path):
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path)
    try:
        admission = await cluster.admission()
        await cluster.placer()
        await cluster.preemptor("preemptor", "--min-runtime", "0", "--max-loss-per-wait", "inf")
        await cluster.agent("node-0", "8xH100-80GB", "--grace", "2")
        client = Client(f"127.0.0.1:{admission.port}")
        # node-0 gets 4 x 1-GPU jobs and a 4-GPU hog; node-1 joins and gets 4 more jobs.
        first = {(await client.submit(spec(f"s-{i}", "ops", gpus=1, duration=8.0, checkpoint_interval=1.0)))
                 .job.job_id for i in range(4)}
        await all_running(client, first)
        await cluster.agent("node-1", "8xH100-80GB", "--grace", "2")
        hog = (await client.submit(spec("hog", "ops", gpus=4, duration=30.0, preemptible=False))).job
        await all_running(client, {hog.job_id})
        second = {(await client.submit(spec(f"t-{i}", "ops", gpus=1, duration=8.0, checkpoint_interval=1.0)))
                  .job.job_id for i in range(4)}
        await all_running(client, second)
        # Ending the hog leaves 4 free GPUs on each node: 8 in all, but no node with 8.
        await client.jobs.CancelJob(admission_pb2.CancelJobRequest(job_id=hog.job_id))
        big = (await client.submit(spec("whole-node", "ops", gpus=8, duration=1.0))).job
        ran = await until(client, lambda j: j.job_id == big.job_id and j.phase in (RUNNING, SUCCEEDED), 60)
        assert ran.phase in (RUNNING, SUCCEEDED)
        jobs = await client.wait_terminal(first | second | {big.job_id}, timeout=120)
        assert {j.phase for j in jobs} == {SUCCEEDED}
        moved = [j for j in jobs if j.preemptions]
        assert 1 <= len(moved) <= 4 and all(j.checkpoint for j in moved)
        await client.close()
    finally:
        await cluster.stop_all()
    log = await read_log(kafka_bootstrap, topics)
    assert check_log(log).violations == []
    assert any(isinstance(e, ev.JobPreempted) and "defragmentation" in e.reason for e in events_of(log))
