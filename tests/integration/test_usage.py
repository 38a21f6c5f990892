"""Measured GPU usage on the real broker: simulated node-agents publish usage records
while jobs run, and the consumer folds them into allocated vs used per team and flags
the job that held its GPU idle."""
from __future__ import annotations

import asyncio
import json
import os
import time

import pytest
from aiokafka import AIOKafkaProducer

from gpusched.adapters.broker.kafka_security import client_args, connection
from gpusched.client import Client, spec
from gpusched.consumers.usage_report import collect, format_report
from gpusched.consumers.utilization import UtilizationLedger
from gpusched.local_cluster import BIN, LocalCluster
from gpusched.v1 import events_pb2, types_pb2, usage_pb2
from tests.integration.logcheck import read_log

SUCCEEDED = types_pb2.JOB_PHASE_SUCCEEDED
INFERENCE = types_pb2.JOB_KIND_INFERENCE
IDLE_AFTER_S = 1.5


async def _run_jobs(kafka_bootstrap, topics, tmp_path) -> None:
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path)
    try:
        admission = await cluster.admission()
        await cluster.placer()
        # the model's per-job knob: jobs named idle-* keep their GPUs at 0 % SM
        await asyncio.gather(*(cluster.agent(f"node-{i}", "4xH100-80GB", "--usage-interval", "0.2",
                                             "--simulated-usage", "idle-*=0") for i in range(2)))
        client = Client(f"127.0.0.1:{admission.port}")
        specs = [spec("train-a", "team-train", gpus=2, duration=4.0),
                 spec("idle-b", "team-idle", gpus=1, duration=4.0),
                 spec("infer-c", "team-infer", gpu_milli=500, duration=4.0, kind=INFERENCE)]
        ids = {r.job.job_id for r in await asyncio.gather(*(client.submit(s) for s in specs))}
        jobs = await client.wait_terminal(ids, timeout=120)
        assert sorted(j.phase for j in jobs) == [SUCCEEDED] * 3, [j.reason for j in jobs]
        await client.close()
    finally:
        await cluster.stop_all()


async def _put_malformed(bootstrap, topic) -> None:
    producer = AIOKafkaProducer(**client_args(bootstrap))
    await producer.start()
    try:
        record = usage_pb2.WorkerUsage(node="node-x", job_id="j", time=1.0, window_s=1.0)   # no record_id
        await producer.send_and_wait(topic, record.SerializeToString(), key=b"node-x")
    finally:
        await producer.stop()


async def test_usage_folds_into_allocated_vs_used_and_flags_the_idle_job(kafka_bootstrap, kafka_credentials, topics,
                                                                       tmp_path):
    await _run_jobs(kafka_bootstrap, topics, tmp_path)
    await _put_malformed(kafka_bootstrap, topics.usage)

    ledger = UtilizationLedger(idle_percent=5.0, idle_after_s=IDLE_AFTER_S)
    reader = await collect(kafka_bootstrap, topics, ledger, write_dead_letters=True)   # as the admin
    report = ledger.report(now=time.time())
    print(format_report(report, ledger))   # shown when the test fails

    # records appeared on their own topic, one bad one went to the dead letters
    assert reader.folded >= 3 * 4 / 0.2 * 0.5, reader.folded
    assert reader.dead == 1
    letters = [events_pb2.DeadLetter.FromString(v)
               for part in (await read_log(kafka_bootstrap, topics, topics.dead_letters)).values() for _, v in part]
    assert [(d.source_topic, d.reason) for d in letters] == [(topics.usage, "record_id: empty")]
    assert report.unattributed == 0

    teams = report.teams
    assert set(teams) == {"team-train", "team-idle", "team-infer"}
    for hours in teams.values():
        assert hours.simulated
        assert 0 <= hours.used < hours.allocated
    # allocated: the GPUs held for about the 4 s the jobs ran (placement to end)
    assert 2 * 4.0 / 3600 <= teams["team-train"].allocated <= 2 * 20.0 / 3600
    # training keeps ~90 % busy; the samples cover most of the allocation
    assert 0.6 < teams["team-train"].utilization < 0.97
    # a 500-milli share at ~45 % load: its GPU reads ~22 %, weighted by the share
    assert 0.1 < teams["team-infer"].utilization < 0.35
    # the idle job: its GPU drew board power but ran nothing
    assert teams["team-idle"].used == 0
    idle = {j.job_id: j for j in report.idle_jobs}
    assert [(j.team, j.name) for j in idle.values()] == [("team-idle", "idle-b")]
    assert next(iter(idle.values())).idle_s >= IDLE_AFTER_S
    assert report.total.allocated == pytest.approx(sum(h.allocated for h in teams.values()))

    # the command prints the same, as JSON
    proc = await asyncio.create_subprocess_exec(
        str(BIN / "gpusched"), "usage", "--json", "--idle-after", str(IDLE_AFTER_S),
        env={**os.environ, **_audit(kafka_bootstrap, kafka_credentials).env(), "GPUSCHED_TOPIC_PREFIX": topics.prefix},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()
    printed = json.loads(out)
    assert printed["idle_jobs"] == list(idle)
    assert printed["teams"]["team-train"]["used"] == teams["team-train"].used


def _audit(kafka_bootstrap, credentials):
    """The report reads as the read-only audit principal on a secured broker."""
    return kafka_bootstrap.as_user("audit", credentials["audit"]) if kafka_bootstrap.secured else kafka_bootstrap


async def _command(*args: str, bootstrap) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        str(BIN / "gpusched"), "usage", *args, env={**os.environ, **connection(bootstrap).env()},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode, err.decode()


async def test_the_command_names_a_missing_topic_and_an_unreachable_broker(kafka_bootstrap):
    rc, err = await _command("--topic-prefix", "no-such-cluster.", bootstrap=kafka_bootstrap)
    assert rc == 1 and "no topic no-such-cluster.cluster-events" in err, err
    rc, err = await _command("--connect-timeout", "1", bootstrap="127.0.0.1:1")
    assert rc == 1 and "did not answer" in err and "Traceback" not in err, err
