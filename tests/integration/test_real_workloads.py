"""Real worker processes on simulated GPU inventories (``--run-processes``): resources
are held until a process is really gone, lost nodes are fenced, time limits, and gangs
that rendezvous (docs/guide/workloads.md).

Every check of "never at once" uses what the workloads recorded themselves
(``tests/workloads/recorder.py``: a start, ticks every 50 ms, an end when it can) and
the end each worker's shim recorded after reaping it, never the log's own release.
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

from gpusched.client import Client, spec
from gpusched.core import events as ev
from gpusched.core.model import EXIT_LOST
from gpusched.local_cluster import LocalCluster
from gpusched.v1 import admission_pb2, types_pb2
from tests.integration.logcheck import check_log, read_log
from tests.integration.cluster_calls import events_of, until
from tests.polling import eventually_async
from tests.workloads.intervals import Interval, attempts_overlap, overlaps, read_records, with_shim_ends

WORKLOADS = Path(__file__).resolve().parents[1] / "workloads"
RECORDER = (sys.executable, str(WORKLOADS / "recorder.py"))
RENDEZVOUS = (sys.executable, str(WORKLOADS / "rendezvous.py"))
RUNNING, SUCCEEDED = types_pb2.JOB_PHASE_RUNNING, types_pb2.JOB_PHASE_SUCCEEDED
CANCELLED, TIMEOUT = types_pb2.JOB_PHASE_CANCELLED, types_pb2.JOB_PHASE_TIMEOUT
LEASE_S, KILL_WAIT_S, BEAT_S = 2.0, 1.5, 0.3
RESTART_LEASE_S = 15.0   # long enough for an agent to start again before its workers' shims fence them


async def real_agent(cluster: LocalCluster, node: str, tmp_path: Path, gpus: int = 1, lease: float = LEASE_S):
    return await cluster.agent(node, f"{gpus}xH100-80GB", "--run-processes", "--state-dir", str(tmp_path / node),
                               "--lease", str(lease), "--grace", str(KILL_WAIT_S),
                               "--heartbeat-interval", str(BEAT_S), "--address", "127.0.0.1")


def lived(root: Path) -> list[Interval]:
    return with_shim_ends(root, read_records(root))


def finished_events(log, job_id: str) -> list[ev.WorkerFinished]:
    return [e for e in events_of(log) if isinstance(e, ev.WorkerFinished) and e.job_id == job_id]


async def test_cancel_and_time_limit_hold_the_gpu_until_the_process_is_gone(kafka_bootstrap, topics, tmp_path):
    """One GPU. A job that ignores SIGTERM is cancelled while another waits: the waiting
    job starts only after the kill deadline's SIGKILL. Then a job hits its time limit."""
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path / "logs")
    try:
        admission = await cluster.admission()
        await cluster.placer()
        await cluster.preemptor()
        await real_agent(cluster, "node-0", tmp_path)
        client = Client(f"127.0.0.1:{admission.port}")
        stubborn = (await client.submit(spec("stubborn", "llm", gpus=1, command=(*RECORDER, "--ignore-term")))).job
        await recorded_start(tmp_path, stubborn.job_id)   # its SIGTERM handler is in place
        waiting = (await client.submit(spec("waiting", "llm", gpus=1, command=(*RECORDER, "--duration", "1")))).job
        await client.jobs.CancelJob(admission_pb2.CancelJobRequest(job_id=stubborn.job_id, reason="user"))
        stopping = await until(client, lambda j: j.job_id == stubborn.job_id and j.phase != RUNNING, 30)
        assert stopping.phase in (types_pb2.JOB_PHASE_STOPPING, CANCELLED)
        limited = (await client.submit(spec("limited", "llm", gpus=1, max_runtime=1.5,
                                            command=(*RECORDER, "--duration", "60")))).job
        done = {j.job_id: j for j in await client.wait_terminal({stubborn.job_id, waiting.job_id, limited.job_id}, 90)}
        assert done[stubborn.job_id].phase == CANCELLED and done[waiting.job_id].phase == SUCCEEDED
        assert done[limited.job_id].phase == TIMEOUT and "time limit" in done[limited.job_id].reason
        await client.close()
    finally:
        await cluster.stop_all()
    intervals = lived(tmp_path / "node-0")
    assert {i.job for i in intervals} == {stubborn.job_id, waiting.job_id, limited.job_id}
    assert overlaps(intervals) == []
    by_job = {i.job: i for i in intervals}
    # the stubborn process outlived SIGTERM by the kill deadline, and the next began after it
    assert by_job[waiting.job_id].start > by_job[stubborn.job_id].last_seen
    log = await read_log(kafka_bootstrap, topics)
    [end] = finished_events(log, stubborn.job_id)
    assert end.signal == signal.SIGKILL
    [end] = finished_events(log, limited.job_id)
    assert (end.exit_code, end.signal) == (143, 0)   # it exited on SIGTERM within its grace
    assert check_log(log).violations == []


async def test_preemption_and_a_failed_gang_member_hold_gpus_until_every_worker_is_gone(
        kafka_bootstrap, topics, tmp_path):
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path / "logs")
    try:
        admission = await cluster.admission()
        await cluster.placer()
        await cluster.preemptor("preemptor", "--min-runtime", "0", "--max-loss-per-wait", "inf")
        await asyncio.gather(*(real_agent(cluster, f"node-{i}", tmp_path) for i in range(2)))
        client = Client(f"127.0.0.1:{admission.port}")
        # A gang whose worker 1 fails at once in attempt 0, while worker 0 ignores SIGTERM.
        script = (f'if [ "$GPUSCHED_ATTEMPT" = 0 ] && [ "$GPUSCHED_WORKER" = 1 ]; '
                  f'then exec {RECORDER[0]} {RECORDER[1]} --duration 0.5 --exit 3; '
                  f'elif [ "$GPUSCHED_ATTEMPT" = 0 ]; then exec {RECORDER[0]} {RECORDER[1]} --ignore-term; '
                  f'else exec {RECORDER[0]} {RECORDER[1]} --duration 1; fi')
        gang = (await client.submit(spec("gang", "llm", gpus=1, workers=2, command=("sh", "-c", script)))).job
        [gang_done] = await client.wait_terminal({gang.job_id}, 90)
        assert gang_done.phase == SUCCEEDED and gang_done.attempt == 1 and gang_done.restarts == 1
        # Preemption: a checkpointing best-effort job on each GPU, then an urgent gang of two.
        fillers = [(await client.submit(spec(f"be-{i}", "research", gpus=1, priority="best-effort",
                                             checkpoint_interval=0.5,
                                             command=(*RECORDER, "--duration", "30", "--checkpoint-every", "0.5"))
                    )).job.job_id for i in range(2)]
        for job_id in fillers:
            await recorded_start(tmp_path, job_id)
        urgent = (await client.submit(spec("urgent", "prod", gpus=1, workers=2, priority="training-high",
                                           command=(*RECORDER, "--duration", "1")))).job
        [urgent_done] = await client.wait_terminal({urgent.job_id}, 90)
        assert urgent_done.phase == SUCCEEDED
        for job_id in fillers:
            await client.jobs.CancelJob(admission_pb2.CancelJobRequest(job_id=job_id))
        await client.wait_terminal(set(fillers), 60)
        await client.close()
    finally:
        await cluster.stop_all()
    intervals = lived(tmp_path)
    assert {i.job for i in intervals} >= {gang.job_id, urgent.job_id, *fillers}
    assert overlaps(intervals) == []
    assert attempts_overlap(intervals) == []
    first = [i for i in intervals if i.job == gang.job_id and i.attempt == 0]
    second = [i for i in intervals if i.job == gang.job_id and i.attempt == 1]
    assert len(first) == 2 and len(second) == 2
    assert min(i.start for i in second) > max(i.last_seen for i in first)   # after worker 0's SIGKILL
    log = await read_log(kafka_bootstrap, topics)
    ends = {e.worker: e for e in finished_events(log, gang.job_id) if e.attempt == 0}
    assert ends[1].exit_code == 3 and ends[0].signal == signal.SIGKILL
    assert check_log(log).violations == []


async def _fenced_node_case(kafka_bootstrap, topics, tmp_path, how: str):
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path / "logs")
    try:
        admission = await cluster.admission()
        await cluster.placer()
        await cluster.preemptor("preemptor", "--heartbeat-timeout", "2")
        # The lease outlasts the heartbeat timeout and the workload ignores SIGTERM: a
        # job placed again as soon as the node is declared lost, or before the kill
        # deadline, would run beside its old attempt. The node is declared lost only once
        # its lease surely ran out (4 s + the 1 s margin), not after the 2 s timeout.
        doomed = await real_agent(cluster, "node-0", tmp_path, lease=4.0)
        client = Client(f"127.0.0.1:{admission.port}")
        job = (await client.submit(spec("train", "llm", gpus=1, checkpoint_interval=0.5,
                                        command=(*RECORDER, "--duration", "6", "--checkpoint-every", "0.5",
                                                 "--ignore-term")))).job
        await until(client, lambda j: j.job_id == job.job_id and j.phase == RUNNING and j.checkpoint, 60)
        await real_agent(cluster, "node-1", tmp_path)
        if how == "sigstop":
            doomed.proc.send_signal(signal.SIGSTOP)     # frozen: no heartbeat, no lease renewal
        else:
            await doomed.kill9()                        # dead: its shim carries on alone
        [done] = await client.wait_terminal({job.job_id}, 120)
        assert done.phase == SUCCEEDED and done.attempt >= 1
        assert {w.node for w in done.workers} == {"node-1"}
        if how == "sigstop":
            doomed.proc.send_signal(signal.SIGCONT)     # back: it learns it was lost, and rejoins empty
            node = await _node_ready(client, "node-0")
            assert not node.jobs
        await client.close()
    finally:
        await cluster.stop_all()
    intervals = lived(tmp_path)
    assert attempts_overlap(intervals) == []
    first = [i for i in intervals if i.attempt == 0]
    later = [i for i in intervals if i.attempt and i.attempt > 0]
    assert first and later
    # the resumed attempt started from the checkpoint the first one saved
    starts = [json.loads(line) for p in (tmp_path / "node-1").rglob("record.jsonl")
              for line in p.read_text().splitlines() if '"start"' in line]
    assert max(s["resumed_from"] for s in starts) > 0
    log = await read_log(kafka_bootstrap, topics)
    events = events_of(log)
    lost = [e for e in events if isinstance(e, ev.NodeLost) and e.node == "node-0"]
    fenced = [e for e in events if isinstance(e, ev.NodeFenced) and e.node == "node-0"]
    assert lost and (fenced or how == "sigstop")
    assert "(timeout 5s)" in lost[0].reason, lost[0]
    # the old attempt was dead (by its shim's record) before the new one was placed
    placed_again = min(e.time for e in events if isinstance(e, ev.JobPlaced) and e.attempt >= 1)
    assert max(i.last_seen for i in first) < placed_again
    assert check_log(log).violations == []


async def _node_ready(client: Client, name: str, timeout: float = 60.0):
    async def ready():   # the node list has no watch; the agent re-registers shortly
        nodes = {n.info.name: n for n in await client.nodes()}
        return name in nodes and nodes[name].status == types_pb2.NODE_STATUS_READY and nodes[name]
    return await eventually_async(ready, f"{name} ready", timeout, poll=0.2)


async def test_frozen_agent_is_fenced_and_its_job_resumes_elsewhere(kafka_bootstrap, topics, tmp_path):
    await _fenced_node_case(kafka_bootstrap, topics, tmp_path, "sigstop")


async def test_killed_agent_is_fenced_and_its_job_resumes_elsewhere(kafka_bootstrap, topics, tmp_path):
    await _fenced_node_case(kafka_bootstrap, topics, tmp_path, "kill9")


async def test_gang_rendezvous_over_tcp_and_again_after_a_restart(kafka_bootstrap, topics, tmp_path):
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path / "logs")
    try:
        admission = await cluster.admission()
        await cluster.placer()
        await cluster.preemptor()
        await asyncio.gather(*(real_agent(cluster, f"node-{i}", tmp_path) for i in range(2)))
        client = Client(f"127.0.0.1:{admission.port}")
        job = (await client.submit(spec("ddp", "llm", gpus=1, workers=2,
                                        command=(*RENDEZVOUS, "--hold", "60", "--hold-attempt", "0")))).job
        met = await _records(tmp_path, job.job_id, 0, 2)
        os.kill(next(r["pid"] for r in met if r["rank"] == 1), signal.SIGKILL)   # one member dies
        [done] = await client.wait_terminal({job.job_id}, 90)
        assert done.phase == SUCCEEDED and done.attempt == 1
        again = await _records(tmp_path, job.job_id, 1, 2)
        await client.close()
    finally:
        await cluster.stop_all()
    for records in (met, again):
        assert sorted(r["rank"] for r in records) == [0, 1]
        assert all(r["ranks"] == [0, 1] and r["world"] == 2 for r in records)
        assert sorted(r["node_rank"] for r in records) == [0, 1] and {r["local_rank"] for r in records} == {0}
        assert len({r["rdzv"] for r in records}) == 1 and len({r["port"] for r in records}) == 1
    assert met[0]["rdzv"] != again[0]["rdzv"]
    log = await read_log(kafka_bootstrap, topics)
    events = events_of(log)
    for attempt in (0, 1):
        [rdzv] = [e for e in events if isinstance(e, ev.RendezvousSet) and e.attempt == attempt]
        starts = [e for e in events if isinstance(e, ev.WorkerStarted) and e.job_id == job.job_id
                  and e.attempt == attempt]
        assert len(starts) == 2 and all(e.time >= rdzv.time for e in starts)
        assert rdzv.node == "node-0" or rdzv.node == "node-1"
    assert check_log(log).violations == []


async def recorded_start(root: Path, job_id: str, attempt: int = 0, timeout: float = 60.0) -> dict:
    """The workload's own start record: it runs (its signal handlers are set), not just
    its process."""
    def started():
        for path in root.rglob("record.jsonl"):
            for line in path.read_text().splitlines():
                rec = json.loads(line)
                if rec["event"] == "start" and rec["job"] == job_id and rec["attempt"] == attempt:
                    return rec
        return None
    return await eventually_async(started, f"the start record of {job_id} attempt {attempt}", timeout, poll=0.05)


async def _records(root: Path, job_id: str, attempt: int, count: int, timeout: float = 60.0) -> list[dict]:
    """The rendezvous records of one attempt, once all of its workers have written theirs
    (a cross-process fact: read back until it is there)."""
    def met():
        found = [json.loads(line) for p in root.rglob("rendezvous.jsonl") for line in p.read_text().splitlines()]
        found = [r for r in found if r["job"] == job_id and r["attempt"] == attempt]
        return len(found) >= count and found
    return await eventually_async(met, f"{count} rendezvous records of {job_id} attempt {attempt}", timeout, poll=0.1)


async def test_a_restarted_agent_keeps_its_workers_and_ends_only_what_the_log_ended(kafka_bootstrap, topics,
                                                                                   tmp_path):
    """An agent killed with -9 comes back within its lease: it takes over the workers its
    shims still run, which finish their attempt as if nothing happened; the one job
    cancelled while it was down is stopped through its shim and reported with its real
    end. Urgent jobs waiting for this node start on the new agent while it is reporting,
    and none is reported gone. No preemptor runs, so nothing else ends a job."""
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path / "logs")
    gpus = 8
    try:
        admission = await cluster.admission()
        await cluster.placer()
        agent = await real_agent(cluster, "node-0", tmp_path, gpus=gpus, lease=RESTART_LEASE_S)
        client = Client(f"127.0.0.1:{admission.port}")
        fillers = [(await client.submit(spec(f"fill-{i}", "research", gpus=1, priority="best-effort",
                                             command=(*RECORDER, "--duration", "5")))).job.job_id
                   for i in range(gpus)]
        for job_id in fillers:
            await recorded_start(tmp_path, job_id)
        urgent = [(await client.submit(spec(f"urgent-{i}", "prod", gpus=1, priority="training-high",
                                            command=(*RECORDER, "--duration", "1")))).job.job_id
                  for i in range(2 * gpus)]
        await agent.kill9()
        cancelled = fillers[0]
        await client.cancel(cancelled)                   # while no agent runs: the new one must stop it
        await real_agent(cluster, "node-0", tmp_path, gpus=gpus, lease=RESTART_LEASE_S)
        done = {j.job_id: j for j in await client.wait_terminal({*fillers, *urgent}, 120)}
        await client.close()
    finally:
        await cluster.stop_all()
    kept = fillers[1:]
    assert done[cancelled].phase == CANCELLED
    assert {j: (done[j].phase, done[j].attempt) for j in [*kept, *urgent]} == {j: (SUCCEEDED, 0) for j in [*kept, *urgent]}
    records = [json.loads(line) for p in (tmp_path / "node-0").rglob("record.jsonl") for line in p.read_text().splitlines()]
    for job_id in kept:   # one start, one end of its own: the workload never noticed the restart
        assert _story(records, job_id) == ["start", "end done"], job_id
    assert _story(records, cancelled) == ["start", "end term"]
    intervals = lived(tmp_path / "node-0")
    assert overlaps(intervals) == [] and attempts_overlap(intervals) == []
    log = await read_log(kafka_bootstrap, topics)
    ends = [e for e in events_of(log) if isinstance(e, ev.WorkerFinished)]
    assert sorted((e.job_id, e.exit_code) for e in ends if e.job_id in kept) == sorted((j, 0) for j in kept)
    [stopped] = [e for e in ends if e.job_id == cancelled]
    assert "restarted" in stopped.reason and stopped.exit_code == EXIT_LOST, stopped   # stopped by the agent
    assert not [e for e in ends if e.job_id in urgent and e.exit_code != 0]
    assert check_log(log).violations == []


async def test_a_rolling_restart_of_every_agent_kills_no_worker(kafka_bootstrap, topics, tmp_path):
    """An upgrade as operators run it: every node-agent stopped (SIGTERM) and started
    again, one node at a time, while each node's GPUs all run real workloads, a 2-node
    gang among them. Every job ends as it would have without the restarts: succeeded in
    its first attempt, each worker started once and ending by itself (its own records)."""
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path / "logs")
    nodes = [f"node-{i}" for i in range(3)]
    try:
        admission = await cluster.admission()
        await cluster.placer()
        await cluster.preemptor()
        agents = dict(zip(nodes, await asyncio.gather(
            *(real_agent(cluster, n, tmp_path, gpus=2, lease=RESTART_LEASE_S) for n in nodes))))
        client = Client(f"127.0.0.1:{admission.port}")
        work = (*RECORDER, "--duration", "20", "--checkpoint-every", "2")
        jobs = [(await client.submit(spec(f"train-{i}", "llm", gpus=1, command=work))).job.job_id for i in range(4)]
        jobs.append((await client.submit(spec("gang", "llm", gpus=1, workers=2, command=work))).job.job_id)
        for job_id in jobs:
            await recorded_start(tmp_path, job_id)
        for node in nodes:
            await agents[node].terminate()
            agents[node] = await real_agent(cluster, node, tmp_path, gpus=2, lease=RESTART_LEASE_S)
        done = await client.wait_terminal(set(jobs), 120)
        await client.close()
    finally:
        await cluster.stop_all()
    assert [(j.phase, j.attempt, j.restarts) for j in done] == [(SUCCEEDED, 0, 0)] * len(jobs)
    records = [json.loads(line) for p in tmp_path.rglob("record.jsonl") for line in p.read_text().splitlines()]
    starts = [r for r in records if r["event"] == "start"]
    assert sorted((r["job"], r["worker"]) for r in starts) == sorted(
        [(j, 0) for j in jobs] + [(jobs[-1], 1)])                       # each worker started once
    assert sorted(r["how"] for r in records if r["event"] == "end") == ["done"] * len(starts)
    intervals = lived(tmp_path)
    assert overlaps(intervals) == [] and attempts_overlap(intervals) == []
    log = await read_log(kafka_bootstrap, topics)
    ends = [e for e in events_of(log) if isinstance(e, ev.WorkerFinished)]
    assert len(ends) == len(starts) and all(e.exit_code == 0 for e in ends)
    assert check_log(log).violations == []


def _story(records: list[dict], job_id: str) -> list[str]:
    """What ``job_id``'s workloads recorded of their starts and ends, in order."""
    pids = {r["pid"] for r in records if r["event"] == "start" and r.get("job") == job_id}
    return [f"{r['event']} {r['how']}" if r["event"] == "end" else r["event"]
            for r in records if r["pid"] in pids and r["event"] in ("start", "end")]
