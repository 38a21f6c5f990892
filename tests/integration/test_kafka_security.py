"""The secured broker refuses what a principal has no business doing (docs/reference/kafka-security.md).

Runs on the suite's broker, secured by default; on a plaintext one (an external cluster,
or GPUSCHED_TEST_KAFKA_SECURITY=plaintext) there is nothing to check, so it skips.
"""
from __future__ import annotations

import asyncio
import os
import secrets
import subprocess

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import ClusterAuthorizationFailedError, TopicAuthorizationFailedError

from gpusched.adapters.broker.kafka_admin import TopicNames, delete_topics, ensure_topics
from gpusched.adapters.broker.kafka_security import KafkaConnection, KafkaLoginRefused, check_login, client_args
from gpusched.adapters.nodes.node_access import add_node
from gpusched.adapters.nodes.reports import beats_topic, node_principal, report_topic
from gpusched.local_cluster import BIN, LocalCluster
from tests.polling import eventually_async


@pytest.fixture
def secured(kafka_bootstrap: KafkaConnection, kafka_credentials: dict[str, str]):
    if not kafka_bootstrap.secured:
        pytest.skip("the test broker is plaintext (GPUSCHED_TEST_KAFKA_SECURITY or an external cluster)")
    return lambda user, password=None: kafka_bootstrap.as_user(
        user, kafka_credentials[user] if password is None else password)


async def _write(conn: KafkaConnection, topic: str, idempotent: bool = False) -> None:
    """One record, acknowledged by the broker; idempotent as the services' producers are."""
    producer = AIOKafkaProducer(**client_args(conn), acks="all", enable_idempotence=idempotent,
                                request_timeout_ms=10_000)
    await producer.start()
    try:
        await producer.send_and_wait(topic, b"forged", key=b"default", partition=0)
    finally:
        await producer.stop()


async def _read(conn: KafkaConnection, topic: str) -> int:
    """Fetch partition 0 from the start (a fetch is what READ guards); records read."""
    consumer = AIOKafkaConsumer(**client_args(conn), enable_auto_commit=False, request_timeout_ms=10_000)
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        end = (await consumer.end_offsets([tp]))[tp]
        read = 0
        while read < end:
            read += len((await consumer.getmany(tp, timeout_ms=5000)).get(tp, ()))
        if not end:   # nothing to read: still a fetch, so a refusal shows
            await consumer.getmany(tp, timeout_ms=500)
        return read
    finally:
        await consumer.stop()


async def test_a_service_with_the_wrong_password_is_refused_at_start(secured, kafka_bootstrap, topics, tmp_path):
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path)
    cluster.credentials["admission"] = "not-the-password"
    with pytest.raises(RuntimeError, match="did not become ready") as failed:
        await cluster.start("admission", "gpusched-admission", "--listen", "127.0.0.1:0", timeout=60)
    log = (tmp_path / "admission.log").read_text()
    # One clear line naming the principal and the refusal, at once, not a timeout.
    assert "refused the login of user 'admission' (SCRAM-SHA-512)" in log, log[-2000:]
    assert "Traceback" not in log, log[-2000:]
    assert failed.value is not None


async def test_a_client_without_the_ca_is_refused(secured, kafka_bootstrap, topics, tmp_path):
    """A CA the broker's certificate was not signed by: the client does not talk to it."""
    other_ca = tmp_path / "other-ca.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=other", "-keyout", str(tmp_path / "k"), "-out", str(other_ca)],
                   check=True, capture_output=True)
    with pytest.raises(KafkaLoginRefused, match="does not verify against CA"):
        await check_login(KafkaConnection(kafka_bootstrap.bootstrap, "SASL_SSL", "admission", "x", str(other_ca)))


async def test_billing_reads_but_cannot_write(secured, topics):
    billing = secured("billing")
    await _write(secured("admission"), topics.events, idempotent=True)
    assert await _read(billing, topics.events) == 1   # reading is its job
    with pytest.raises(TopicAuthorizationFailedError):
        await _write(billing, topics.events)
    with pytest.raises(TopicAuthorizationFailedError):
        await _write(billing, topics.dead_letters)
    # An idempotent producer (as the services use) is refused its producer id already.
    with pytest.raises(ClusterAuthorizationFailedError):
        await _write(billing, topics.events, idempotent=True)


async def test_a_node_agent_writes_only_its_own_report_and_beats_topics(secured, kafka_bootstrap, topics):
    password = await add_node(kafka_bootstrap, topics, "n1")
    agent = secured(node_principal("n1"), password)
    for topic in (report_topic(topics.prefix, "n1"), beats_topic(topics.prefix, "n1")):
        await _write(agent, topic, idempotent=True)
        assert await _read(secured("audit"), topic) == 1   # the auditor reads what nodes send
    with pytest.raises(TopicAuthorizationFailedError):
        await _read(agent, topics.events)   # every team's jobs: not a node's to read (it reads its work view)
    await add_node(kafka_bootstrap, topics, "n2")
    for topic in (topics.events, topics.snapshots, topics.heartbeats, topics.usage,
                  report_topic(topics.prefix, "n2"), beats_topic(topics.prefix, "n2")):
        with pytest.raises(TopicAuthorizationFailedError):
            await _write(agent, topic)
    with pytest.raises(TopicAuthorizationFailedError):
        await _read(agent, topics.usage)   # no reading the fleet's measurements either
    with pytest.raises(KafkaLoginRefused):   # its own password only
        await check_login(secured(node_principal("n1"), "not-its-password"))


async def test_only_a_node_set_up_to_fold_the_pool_log_reads_it_and_running_the_setup_again_takes_it_back(
        secured, kafka_bootstrap, topics):
    await _write(secured("admission"), topics.events, idempotent=True)
    password = await add_node(kafka_bootstrap, topics, "n1", reads_log=True)   # its agent runs --source log
    assert await _read(secured(node_principal("n1"), password), topics.events) == 1
    password = await add_node(kafka_bootstrap, topics, "n1")                   # back to its work view
    with pytest.raises(TopicAuthorizationFailedError):
        await _read(secured(node_principal("n1"), password), topics.events)


async def test_a_principal_without_a_role_writes_and_reads_nothing(secured, topics):
    nobody = secured("nobody")
    for topic in topics.all():
        with pytest.raises(TopicAuthorizationFailedError):
            await _write(nobody, topic)
    # Not even the topics' existence: metadata lists none of them to it.
    assert not set(topics.all()) & await _visible(nobody)
    assert set(topics.all()) <= await _visible(secured("audit"))   # the check can see them


async def _visible(conn: KafkaConnection) -> set[str]:
    consumer = AIOKafkaConsumer(**client_args(conn))
    await consumer.start()
    try:
        return await consumer.topics()
    finally:
        await consumer.stop()


async def test_acls_name_the_prefix_so_one_deployment_cannot_write_anothers(secured, topics):
    """The placer of these topics may write them, not the same topics under another prefix."""
    other = TopicNames(topics.prefix.rstrip(".") + "-other.")
    await ensure_topics(secured("admin"), other)   # no ACLs granted for it
    try:
        await _write(secured("placer"), topics.snapshots, idempotent=True)
        with pytest.raises(TopicAuthorizationFailedError):
            await _write(secured("placer"), other.snapshots)
    finally:
        await delete_topics(secured("admin"), other, timeout_s=10)


async def _kafka_setup(conn: KafkaConnection, prefix: str, *more: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        str(BIN / "gpusched"), "kafka-setup", "--topic-prefix", prefix, "--log-level", "ERROR", *more,
        env={**os.environ, **conn.env()}, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), 120)
    return proc.returncode, out.decode()


async def test_kafka_setup_as_the_admin_is_what_services_need(secured, kafka_bootstrap, tmp_path):
    names = TopicNames(f"t-setup-{secrets.token_hex(3)}.")
    # A service's principal may not create topics: a clear line, at once.
    rc, out = await _kafka_setup(secured("placer"), names.prefix)
    assert rc == 1 and "may not create it: run `gpusched kafka-setup` as the admin first" in out, out
    assert "Traceback" not in out
    try:
        rc, out = await _kafka_setup(secured("admin"), names.prefix, "--node", "n7",
                                     "--node-secrets", str(tmp_path / "nodes"))
        assert rc == 0 and f"topics {names.prefix}* ready" in out, out
        secret = tmp_path / "nodes" / "node-agent.n7"
        assert f"user node-agent.n7, password in {secret}" in out, out
        assert secret.stat().st_mode & 0o777 == 0o600
        cluster = LocalCluster(kafka_bootstrap, names, tmp_path)
        cluster.credentials["node-agent.n7"] = secret.read_text().strip()
        try:
            await cluster.admission()   # logs in as "admission": the ACLs made by the command suffice
            await cluster.placer()
            await cluster.agent("n7")   # with the login the command made: registered through the relay
        finally:
            await cluster.stop_all()
    finally:
        await delete_topics(secured("admin"), names, timeout_s=10)


async def test_billing_consumer_runs_as_its_read_only_principal(secured, kafka_bootstrap, topics, tmp_path):
    """The billing consumer (faust) reads and commits its group's offsets as ``billing``,
    a principal that may write no topic (docs/guide/audit-billing.md)."""
    from aiokafka.admin import AIOKafkaAdminClient

    from gpusched.consumers.store import Store

    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path)
    try:
        await cluster.admission()   # records admission's settings in the log
    finally:
        await cluster.stop_all()
    url = f"sqlite:///{tmp_path / 'billing.db'}"
    proc = await asyncio.create_subprocess_exec(
        str(BIN / "gpusched"), "billing-consumer", "--db", url, "--topic-prefix", topics.prefix,
        "--log-level", "WARNING", env={**os.environ, **secured("billing").env()},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    admin = AIOKafkaAdminClient(**client_args(secured("admin")))
    await admin.start()
    try:
        seen = b""
        while b"billing-consumer ready" not in seen:   # aiokafka may log a coordinator not ready yet first
            line = await asyncio.wait_for(proc.stdout.readline(), 120)
            assert line, seen.decode()
            seen += line
        async def committed() -> bool:   # faust commits every second
            assert proc.returncode is None
            offsets = await admin.list_consumer_group_offsets(topics.prefix + "billing")
            return any(meta.offset > 0 for meta in offsets.values())
        await eventually_async(committed, "a commit of the billing consumer", 120, poll=0.2)
        assert Store(url, create=False).progress(topics.prefix, "billing")
    finally:
        await admin.close()
        proc.terminate()
        out, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert "Authorization" not in out.decode(), out.decode()[-2000:]
