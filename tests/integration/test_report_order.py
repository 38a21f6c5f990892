"""A real node-agent's reports when the broker fails them (services/node-agent/agent.py,
gpusched/adapters/nodes/reports.py): a worker's end is queued behind its start without waiting
for the start's acknowledgement, and a start whose first send failed is sent again and
must be in the log before the end.

A broker that is only away does not fail a queued report: the idempotent producer holds
it and sends it once the broker is back, in order. A broker that refuses it does: here
the node's write permission on its report topic is taken away while short jobs start
and end, the broker is restarted meanwhile, then the permission is given back.

Checked from the pool log itself, folded with the reducer: every attempt has exactly one
accepted WorkerStarted, before its one accepted WorkerFinished (a start sent again after
the end is judged stale), every job ends once with its workload's exit code, and no
worker's end is lost."""
from __future__ import annotations

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.protocol.admin import DeleteAclsRequest

from gpusched.adapters.log import codec
from gpusched.adapters.broker.kafka_acls import WRITE, create_acls, node_acl_entries
from gpusched.adapters.broker.kafka_security import client_args
from gpusched.adapters.nodes.reports import report_topic
from gpusched.client import Client, spec
from gpusched.core import events as ev
from gpusched.core.reducer import apply
from gpusched.core.state import ClusterState
from gpusched.local_cluster import LocalCluster
from gpusched.v1 import types_pb2
from tests.integration.logcheck import check_log, read_log
from tests.integration.cluster_calls import until

JOBS, GPUS = 24, 8
SUCCEEDED, FAILED, PLACED = types_pb2.JOB_PHASE_SUCCEEDED, types_pb2.JOB_PHASE_FAILED, types_pb2.JOB_PHASE_PLACED


def job_spec(i: int) -> types_pb2.JobSpec:
    """A job whose one worker exits with code ``i % 4``, never retried: its end is the
    workload's exit code. The first ``GPUS`` run 0 to ``GPUS - 1`` seconds: their ends
    come at different times after their starts were refused."""
    code = i % 4
    command = ("true",) if code == 0 else ("sh", "-c", f"exit {code}")
    if 0 < i < GPUS:
        command = ("sh", "-c", f"sleep {i}; exit {code}")
    msg = spec(f"short-{i}", "t", gpus=1, command=command)
    msg.max_restarts = 0
    return msg


def write_acls(topics, node: str) -> list[tuple]:
    topic = report_topic(topics.prefix, node)
    return [e for e in node_acl_entries(topics, node) if e[1] == topic and e[5] == WRITE]


async def refuse_writes(cluster: LocalCluster, topics, node: str) -> None:
    """Take the node's permission to write its report topic away: the broker refuses its
    reports (TOPIC_AUTHORIZATION_FAILED), which the producer does not retry."""
    admin = AIOKafkaAdminClient(**client_args(cluster.connection))
    await admin.start()
    try:
        for rtype, name, pattern, principal, host, op, permission in write_acls(topics, node):
            reply = await admin._send_request(DeleteAclsRequest(rtype, name, pattern, principal, host, op, permission))
            assert [acls for _, _, acls in reply.filter_responses] != [[]], reply
    finally:
        await admin.close()


def fold(log: dict[int, list]) -> dict[tuple, list[tuple[int, str, bool, object]]]:
    """Every worker report in the pool log, per (job, attempt, worker): (offset, kind,
    accepted, event) in log order, as the reducer judged it."""
    reports: dict[tuple, list] = {}
    for records in log.values():
        state = ClusterState()
        for offset, value in records:
            event, _ = codec.decode(value)
            accepted = apply(state, event).accepted
            if isinstance(event, (ev.WorkerStarted, ev.WorkerFinished)):
                key = (event.job_id, event.attempt, event.worker)
                reports.setdefault(key, []).append((offset, type(event).__name__, accepted, event))
    return reports


async def test_a_refused_start_is_in_the_log_before_its_end(kafka_bootstrap, topics, tmp_path, kafka_control):
    if not kafka_bootstrap.secured:
        pytest.skip("needs the broker's ACLs (GPUSCHED_TEST_KAFKA_SECURITY=sasl_ssl)")
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path / "logs")
    try:
        admission = await cluster.admission()
        await cluster.placer()
        await cluster.agent("node-0", f"{GPUS}xH100-80GB", "--run-processes", "--state-dir", str(tmp_path / "node-0"),
                            "--lease", "120", "--heartbeat-interval", "0.3", "--address", "127.0.0.1")
        client = Client(f"127.0.0.1:{admission.port}")
        # The broker refuses the agent's reports from its first start on; while starts and
        # ends are refused and sent again, it is restarted; then it takes them again.
        await refuse_writes(cluster, topics, "node-0")
        expected = {(await client.submit(job_spec(i))).job.job_id: i % 4 for i in range(JOBS)}
        await until(client, lambda j: j.job_id in expected and j.phase == PLACED, 60)
        await kafka_control.restart_async(hard=False)
        await create_acls(kafka_control.bootstrap, write_acls(topics, "node-0"), "node-0's reports")
        done = {j.job_id: j for j in await client.wait_terminal(set(expected), 90)}
        await client.close()
    finally:
        await cluster.stop_all()
    # A refused record never reaches the topic: only the agent's own log says it was refused.
    assert "WorkerStarted not acknowledged" in (tmp_path / "logs" / "agent-node-0.log").read_text()
    log = await read_log(kafka_bootstrap, topics)
    assert check_log(log).violations == []
    reports = fold(log)
    assert {job_id for job_id, _, _ in reports} == set(expected)
    for key, seen in reports.items():
        accepted = [(kind, event) for _, kind, ok, event in seen if ok]
        assert [kind for kind, _ in accepted] == ["WorkerStarted", "WorkerFinished"], (key, seen)
        assert accepted[1][1].exit_code == expected[key[0]], (key, seen)
        assert key[1:] == (0, 0), (key, seen)   # one attempt, one worker: never run again
    assert {job_id: job.phase for job_id, job in done.items()} == \
        {job_id: SUCCEEDED if code == 0 else FAILED for job_id, code in expected.items()}
