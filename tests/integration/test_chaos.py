"""Chaos: 2,000 jobs while admission, placer, preemptor and node-agents are killed with
kill -9 at random moments, several times each, and the broker restarts once. Afterwards
the log must show every job ended (or running), none lost, none run twice at once, and
no GPU ever over-allocated.

One node runs every job as a real process under its shim (``--run-processes``); its
workloads record their own lives (``tests/workloads/recorder.py``), so "never twice at
once" and "never over-allocated" are also checked against when the processes really
ran and ended, not only against the log's release."""
from __future__ import annotations

import asyncio
import random
import sys
from pathlib import Path

from gpusched.client import Client, seconds
from gpusched.local_cluster import LocalCluster
from gpusched.v1 import types_pb2
from gpusched.workloads import mixed_jobs
from gpusched.ports import free_port
from gpusched.adapters.log import codec
from gpusched.core import events as ev
from tests.integration.logcheck import check_log, read_log
from tests.workloads.intervals import attempts_overlap, over_capacity, read_records, with_shim_ends
from tests.integration.cluster_calls import submit_with_retries

JOBS = 2000
AGENT_ARGS = ("--heartbeat-interval", "0.5", "--grace", "2")
REAL_NODE = "node-3"
RECORDER = (sys.executable, str(Path(__file__).resolve().parents[1] / "workloads" / "recorder.py"))


def agent_args(node: str, state_root: Path) -> tuple[str, ...]:
    if node != REAL_NODE:
        return AGENT_ARGS
    return (*AGENT_ARGS, "--run-processes", "--lease", "2", "--state-dir", str(state_root / node))


async def chaos(cluster: LocalCluster, kafka_control, rng: random.Random, admission_port: int, rounds: int,
                state_root: Path) -> list[str]:
    victims = ["admission", "placer", "preemptor", "agent-node-0", "agent-node-1", "agent-node-2", "agent-node-3"]
    schedule = [v for v in victims for _ in range(2)] + rng.sample(victims, rounds - 2 * len(victims))
    rng.shuffle(schedule)
    broker_at = len(schedule) // 2
    done = []
    for i, name in enumerate(schedule):
        await asyncio.sleep(rng.uniform(1.0, 3.0))   # chaos clock: random moments
        if i == broker_at:
            await kafka_control.restart_async(hard=False)
            done.append("broker")
        service = next(s for s in reversed(cluster.services) if s.name == name)
        await service.kill9()
        if name.startswith("agent-") and rng.random() < 0.5:
            await asyncio.sleep(4.0)                  # stay dead past the heartbeat timeout
        await restart(cluster, name, admission_port, state_root)
        done.append(name)
    return done


async def restart(cluster: LocalCluster, name: str, admission_port: int, state_root: Path) -> None:
    if name == "admission":
        await cluster.admission("admission", admission_port)
    elif name == "placer":
        await cluster.placer("placer")
    elif name == "preemptor":
        await cluster.preemptor("preemptor", "--heartbeat-timeout", "3", "--min-runtime", "1", "--max-loss-per-wait", "inf")
    else:
        node = name.removeprefix("agent-")
        await cluster.agent(node, "8xH100-80GB", *agent_args(node, state_root))


async def test_chaos_run_loses_nothing_runs_nothing_twice_never_overallocates(kafka_bootstrap, topics, tmp_path, kafka_control):
    rng = random.Random(2026)
    port = free_port()
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path)
    try:
        await cluster.admission("admission", port)
        await cluster.placer("placer")
        await cluster.preemptor("preemptor", "--heartbeat-timeout", "3", "--min-runtime", "1", "--max-loss-per-wait", "inf")
        await asyncio.gather(*(cluster.agent(f"node-{i}", "8xH100-80GB", *agent_args(f"node-{i}", tmp_path))
                               for i in range(4)))
        specs = mixed_jobs(JOBS, seed=99, duration=(0.05, 0.4))
        for i, s in enumerate(specs):
            # the command runs where a node runs processes; elsewhere the simulated duration does
            s.command.extend([*RECORDER, "--duration", f"{seconds(s.simulated_duration):.3f}", "--tick", "0.02"])
            if i % 5 == 0:
                s.checkpoint_interval.FromMilliseconds(100)
                s.command.extend(["--checkpoint-every", "0.1"])
        keys = [f"chaos-{i}" for i in range(JOBS)]
        submitting = asyncio.create_task(submit_with_retries(f"127.0.0.1:{port}", specs, keys))
        killed = await chaos(cluster, kafka_control, rng, port, rounds=16, state_root=tmp_path)
        ids = await submitting
        assert "broker" in killed and len(killed) == 17
        assert len(set(ids.values())) == JOBS        # one job per key, none lost

        client = Client(f"127.0.0.1:{port}")
        jobs = await client.wait_terminal(set(ids.values()), timeout=600)
        assert len(jobs) == JOBS
        phases = {types_pb2.JobPhase.Name(j.phase) for j in jobs}
        assert phases <= {"JOB_PHASE_SUCCEEDED", "JOB_PHASE_FAILED"}, phases
        await client.close()
    finally:
        await cluster.stop_all()

    log = await read_log(kafka_bootstrap, topics)
    report = check_log(log)
    assert report.violations == []
    in_log = {j.job_id: j for j in report.jobs()}
    assert set(ids.values()) <= in_log.keys()
    assert all(in_log[j].phase.terminal for j in ids.values())
    assert len(in_log) == JOBS                      # no job the clients did not ask for

    # The real node, by its workloads' own records and their shims' ends.
    lived = with_shim_ends(tmp_path / REAL_NODE, read_records(tmp_path / REAL_NODE))
    assert len({i.job for i in lived}) >= 50, "the real node ran too few jobs to say anything"
    per_gpu = {j.job_id: j.spec.resources.milli // max(1, j.spec.resources.gpus) for j in in_log.values()}
    assert over_capacity(lived, per_gpu) == []
    assert attempts_overlap(lived) == []
    assert elsewhere_during_a_process(lived, log) == []


def elsewhere_during_a_process(lived, log) -> list[str]:
    """Another attempt of a job started (on any node) while one of its processes on the
    real node was still alive, or a process started while a simulated attempt ran."""
    events = [codec.decode(v)[0] for records in log.values() for _, v in records if v]
    started = [e for e in events if isinstance(e, ev.WorkerStarted) and e.node != REAL_NODE]
    found = []
    for i in lived:
        for e in started:
            if e.job_id != i.job or e.attempt == i.attempt:
                continue
            end = simulated_end(events, e)
            if i.start < e.time < i.last_seen or e.time < i.start < end:
                found.append(f"{i.job}: attempt {i.attempt} ran on {REAL_NODE} {i.start:.3f}-{i.last_seen:.3f}, "
                             f"attempt {e.attempt} on {e.node} {e.time:.3f}-{end:.3f}")
    return found


def simulated_end(events, started: ev.WorkerStarted) -> float:
    """When a simulated run ended: its agent's report, or its agent's end — a simulated
    run lives in its agent's process, so it is gone once the node re-registers (a new
    agent) or is declared lost, whatever a late report of the old attempt says."""
    ends = [e.time for e in events if e.time >= started.time and (
        (isinstance(e, ev.WorkerFinished) and (e.job_id, e.attempt, e.worker) ==
         (started.job_id, started.attempt, started.worker))
        or (isinstance(e, (ev.NodeRegistered,)) and e.node.name == started.node)
        or (isinstance(e, ev.NodeLost) and e.node == started.node))]
    return min(ends, default=started.time)
