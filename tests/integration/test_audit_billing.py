"""The faust audit and billing consumers on the real broker, writing to real databases
(SQLite, and a PostgreSQL server the fixtures start): killed -9 mid-stream and restarted,
and replayed from the beginning, their totals equal a from-scratch fold of the log."""
from __future__ import annotations

import asyncio
import json
import os
import signal

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from gpusched.adapters.log import codec

from gpusched.adapters.broker import dev_pki
from gpusched.adapters.broker.kafka_security import client_args
from gpusched.client import Client, ClientTls, spec
from gpusched.consumers.billing import BillingLedger
from gpusched.consumers.records import allocated_hours
from gpusched.consumers.store import Store, span_start
from gpusched.core.reducer import apply
from gpusched.core.state import ClusterState
from gpusched.local_cluster import BIN, LocalCluster
from gpusched.v1 import admission_pb2, cluster_pb2, types_pb2
from tests.integration.logcheck import read_log
from tests.polling import eventually_async

BINDINGS = [{"principal": "alice", "role": "member", "team": "team-a"},
            {"principal": "bob", "role": "member", "team": "team-b"},
            {"principal": "ops", "role": "operator"}]
TERMINAL = {types_pb2.JOB_PHASE_SUCCEEDED, types_pb2.JOB_PHASE_FAILED, types_pb2.JOB_PHASE_CANCELLED}


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'accounting.db'}"
    return request.getfixturevalue("postgres_url")


class Consumer:
    """``gpusched <kind>-consumer`` as its own process, logging in as its principal."""

    def __init__(self, kind: str, cluster: LocalCluster, db_url: str, log_dir) -> None:
        self.kind, self.cluster, self.db_url = kind, cluster, db_url
        self.log_path = log_dir / f"{kind}-consumer.log"
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        env = {**os.environ, **self.cluster.kafka_env(self.kind), "GPUSCHED_TOPIC_PREFIX": self.cluster.topics.prefix,
               "GPUSCHED_PARTITIONS": str(self.cluster.partitions), "PYTHONUNBUFFERED": "1"}
        self.proc = await asyncio.create_subprocess_exec(
            str(BIN / "gpusched"), f"{self.kind}-consumer", "--db", self.db_url, "--log-level", "WARNING",
            env=env, stdout=open(self.log_path, "ab"), stderr=asyncio.subprocess.STDOUT)

    async def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        await self.proc.wait()

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), 30)
            except asyncio.TimeoutError:
                await self.kill9()

    def check_alive(self) -> None:
        if self.proc.returncode is not None:
            raise AssertionError(f"{self.kind} consumer exited {self.proc.returncode}:\n"
                                 f"{self.log_path.read_text()[-3000:]}")


async def _ends(bootstrap, topic: str) -> dict[int, int]:
    consumer = AIOKafkaConsumer(**client_args(bootstrap))
    await consumer.start()
    try:
        await consumer._client.force_metadata_update()
        tps = [TopicPartition(topic, p) for p in consumer._client.cluster.partitions_for_topic(topic)]
        return {tp.partition: end for tp, end in (await consumer.end_offsets(tps)).items()}
    finally:
        await consumer.stop()


async def _until(condition, consumers, what: str, timeout: float = 120.0) -> None:
    """Poll the database (what the consumers write is only seen there) until ``condition``;
    a consumer that died fails at once."""
    def holds() -> bool:
        if condition():
            return True
        for c in consumers:
            c.check_alive()
        return False
    await eventually_async(holds, what, timeout, poll=0.1)


def _caught_up(store: Store, prefix: str, kind: str, ends: dict[str, dict[int, int]], delivered_at_least: int = 0):
    def check() -> bool:
        done = store.progress(prefix, kind)
        written = all(done.get((topic, p), (-1, 0))[0] >= end - 1
                      for topic, parts in ends.items() for p, end in parts.items() if end)
        return written and sum(d for _, d in done.values()) >= delivered_at_least
    return check


async def _reference(bootstrap, topics) -> dict[str, float]:
    """GPU-hours per team from a from-scratch fold of the log (the billing fold)."""
    ledger = BillingLedger()
    for records in (await read_log(bootstrap, topics)).values():
        state = ClusterState()
        for _, value in records:
            event = codec.decode(value)[0]
            outcome = apply(state, event)
            if outcome.accepted:
                for job_id in outcome.jobs:
                    if job_id in state.jobs:
                        ledger.observe(state.jobs[job_id], event.time)
    return ledger.gpu_hours()


async def _workload(cluster: LocalCluster, pki, consumers) -> tuple[dict, set[str]]:
    """Jobs of two teams (one cancelled by its owner), a cordon by an operator; the
    consumers are killed -9 while jobs still run. Returns the clients and the job ids."""
    admission = await cluster.admission()
    await cluster.placer()
    await asyncio.gather(*(cluster.agent(f"node-{i}", "4xH100-80GB", "--usage-interval", "0.2") for i in range(2)))
    tls = ClientTls.from_files(pki.ca)
    clients = {p: Client(f"127.0.0.1:{admission.port}", tls, pki.tokens[p]) for p in pki.tokens}
    jobs = [("alice", spec(f"a-{i}", "team-a", gpus=1 + i % 2, duration=1.5 + 0.5 * (i % 3))) for i in range(6)]
    jobs += [("bob", spec(f"b-{i}", "team-b", gpu_milli=500, duration=2.0 + 0.5 * (i % 2))) for i in range(6)]
    ids = set()
    for who, job in jobs:
        ids.add((await clients[who].submit(job)).job.job_id)
    long_job = (await clients["alice"].submit(spec("a-long", "team-a", gpus=1, duration=600))).job.job_id
    ids.add(long_job)
    await clients["ops"].cluster.CordonNode(cluster_pb2.CordonNodeRequest(name="node-1", reason="maintenance"))
    return clients, ids, long_job


async def test_consumers_survive_kill9_and_redelivery_without_double_counting(
        kafka_bootstrap, topics, tmp_path, db_url):
    pki = dev_pki.write(tmp_path / "pki", BINDINGS)
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path / "logs", pki=pki)
    store = Store(db_url)
    consumers = [Consumer(kind, cluster, db_url, tmp_path) for kind in ("billing", "audit")]
    clients: dict = {}
    try:
        for c in consumers:
            await c.start()
        clients, ids, long_job = await _workload(cluster, pki, consumers)
        # mid-stream: as soon as the first allocation is stored, while jobs still run
        await _until(lambda: store.count(span_start, topics.prefix) > 0, consumers, "a first allocation row")
        for c in consumers:
            await c.kill9()
        running = [j for j in await clients["ops"].list_all() if j.phase not in TERMINAL and j.job_id != long_job]
        assert running, "the workload ended before the kill: nothing was mid-stream"
        await clients["alice"].jobs.CancelJob(admission_pb2.CancelJobRequest(job_id=long_job, reason="not needed"))
        finished = await clients["ops"].wait_terminal(ids, timeout=180)
        assert {j.phase for j in finished} <= TERMINAL
        await clients["ops"].cluster.UncordonNode(cluster_pb2.UncordonNodeRequest(name="node-1"))
        await cluster.stop_all()   # the log is complete now

        for c in consumers:
            await c.start()
        ends = {topics.events: await _ends(kafka_bootstrap, topics.events),
                topics.usage: await _ends(kafka_bootstrap, topics.usage)}
        await _until(_caught_up(store, topics.prefix, "billing", ends), consumers, "billing to catch up")
        await _until(_caught_up(store, topics.prefix, "audit", {topics.events: ends[topics.events]}), consumers,
                     "audit to catch up")

        reference = await _reference(kafka_bootstrap, topics)
        assert set(reference) == {"team-a", "team-b"} and all(h > 0 for h in reference.values()), reference
        stored = {k[0]: h for k, h in allocated_hours(store.spans(topics.prefix), ("team",)).items()}
        assert stored == pytest.approx(reference, rel=1e-9, abs=1e-12)
        assert all(s.end is not None for s in store.spans(topics.prefix))   # every start has its end
        by_day = allocated_hours(store.spans(topics.prefix), ("team", "day"))
        assert sum(by_day.values()) == pytest.approx(sum(reference.values()), rel=1e-9)

        # redelivery: the groups' offsets back to the beginning, everything comes again
        rows_before = {kind: _row_counts(store, topics.prefix) for kind in ("all",)}
        delivered = {c.kind: sum(d for _, d in store.progress(topics.prefix, c.kind).values()) for c in consumers}
        for c in consumers:
            await c.stop()
            await _reset_group(kafka_bootstrap, topics.prefix + c.kind, ends if c.kind == "billing"
                               else {topics.events: ends[topics.events]})
            await c.start()
        total = {kind: sum(sum(p.values()) for t, p in ends.items() if kind == "billing" or t == topics.events)
                 for kind in ("billing", "audit")}
        for c in consumers:
            await _until(_caught_up(store, topics.prefix, c.kind, ends if c.kind == "billing"
                                    else {topics.events: ends[topics.events]}, delivered[c.kind] + total[c.kind]),
                         consumers, f"{c.kind} to be redelivered everything")
        assert {k[0]: h for k, h in allocated_hours(store.spans(topics.prefix), ("team",)).items()} == stored
        assert {"all": _row_counts(store, topics.prefix)} == rows_before

        # audit: who did what
        rows = store.audit(topics.prefix)
        submitted = {(r.principal, r.team) for r in rows if r.action == "JobSubmitted"}
        assert submitted == {("alice", "team-a"), ("bob", "team-b")}
        assert sum(r.action == "JobSubmitted" for r in rows) == len(ids)
        cancels = [(r.principal, r.subject, r.detail) for r in rows if r.action == "JobCancelled"]
        assert cancels == [("alice", long_job, "not needed")]
        assert [(r.action, r.subject, r.principal) for r in rows if r.action in ("NodeCordoned", "NodeUncordoned")] \
            == [("NodeCordoned", "node-1", "ops"), ("NodeUncordoned", "node-1", "ops")]
        registered = [r for r in rows if r.action == "NodeRegistered"]
        assert len(registered) >= 2 and all(r.principal == "" and r.producer for r in registered)

        # the commands read the database
        out = await _command("billing", "--db", db_url, "--topic-prefix", topics.prefix, "--json")
        printed = {row["team"]: row["allocated"] for row in json.loads(out)["rows"]}
        assert printed == pytest.approx(reference, rel=1e-9)
        used = {row["team"]: row["used"] for row in json.loads(out)["rows"]}
        assert 0 < used["team-a"] < printed["team-a"], used   # measured by the simulated agents
        out = await _command("audit", "--db", db_url, "--topic-prefix", topics.prefix, "--principal", "alice",
                             "--action", "JobCancelled", "--json")
        assert [r["subject"] for r in json.loads(out)] == [long_job]
    finally:
        for client in clients.values():
            await client.close()
        for c in consumers:
            await c.stop()
        await cluster.stop_all()
        store.close()


def _row_counts(store: Store, prefix: str) -> dict[str, int]:
    from gpusched.consumers.store import audit, gpu_usage, span_end
    return {t.name: store.count(t, prefix) for t in (audit, span_start, span_end, gpu_usage)}


async def _reset_group(bootstrap, group: str, ends: dict[str, dict[int, int]]) -> None:
    """What ``kafka-consumer-groups --reset-offsets --to-earliest`` does, for a stopped group."""
    consumer = AIOKafkaConsumer(**client_args(bootstrap), group_id=group, enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for topic, parts in ends.items() for p in parts]
        consumer.assign(tps)
        await consumer.commit({tp: 0 for tp in tps})
    finally:
        await consumer.stop()


async def _command(*args: str, expect_rc: int = 0) -> str:
    proc = await asyncio.create_subprocess_exec(str(BIN / "gpusched"), *args, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == expect_rc, (proc.returncode, out.decode(), err.decode())
    return out.decode() if expect_rc == 0 else err.decode()


@pytest.mark.parametrize("command", [
    ("billing-consumer", "--bootstrap", "127.0.0.1:1", "--connect-timeout", "1", "--db", "sqlite:///{tmp}/a.db"),
    ("audit-consumer", "--db", "postgresql://nobody@127.0.0.1:1/none"),
    ("billing", "--db", "postgresql://nobody@127.0.0.1:1/none"),
    ("audit", "--db", "sqlite:///{tmp}/missing.db"),
])
async def test_an_unreachable_broker_or_database_is_one_line(command, tmp_path):
    args = [a.replace("{tmp}", str(tmp_path)) for a in command]
    err = await _command(*args, expect_rc=1)
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert ("did not answer" in err) if "--bootstrap" in args else ("database" in err), err


async def test_a_consumer_for_a_prefix_without_topics_says_so(kafka_bootstrap, tmp_path):
    proc = await asyncio.create_subprocess_exec(
        str(BIN / "gpusched"), "audit-consumer", "--topic-prefix", "no-such-cluster.", "--db",
        f"sqlite:///{tmp_path / 'a.db'}", env={**os.environ, **kafka_bootstrap.env()},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 1 and "no topic no-such-cluster.cluster-events" in err.decode(), err.decode()
    assert "Traceback" not in err.decode()
