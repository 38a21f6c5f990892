"""Connection settings, replication defaults and the ACL table (no broker)."""
from __future__ import annotations

import argparse
import subprocess

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpusched.adapters.broker.kafka_acls import (DESCRIBE, DESCRIBE_CONFIGS, GRANTS, IDEMPOTENT_WRITE, READ, WRITE,
                                          acl_entries, node_acl_entries)
from gpusched.adapters.broker.kafka_admin import TopicNames, replication_for, topic_specs
from gpusched.adapters.broker.kafka_security import KafkaConnection, client_args, connection, load_credentials
from gpusched.config import KafkaSettings, kafka_settings


def _secured(**kw) -> KafkaConnection:
    return KafkaConnection("127.0.0.1:9093", "SASL_SSL", kw.pop("username", "placer"),
                           kw.pop("password", "pw"), kw.pop("ca_file", "/nonexistent/ca.pem"), **kw)


def test_a_bare_bootstrap_is_plaintext():
    assert client_args("h:1") == {"bootstrap_servers": "h:1"}
    assert connection("h:1").env() == {"KAFKA_BOOTSTRAP_SERVERS": "h:1", "GPUSCHED_KAFKA_SECURITY_PROTOCOL": "PLAINTEXT"}


def test_sasl_ssl_needs_login_and_ca_and_names_what_is_missing():
    with pytest.raises(ValueError, match="needs a user, a password and a CA"):
        KafkaConnection("h:1", "SASL_SSL", "placer", "", "ca.pem")
    with pytest.raises(ValueError, match="protocol must be one of"):
        KafkaConnection("h:1", "SSL")


def test_the_password_stays_out_of_repr_and_str():
    conn = _secured(password="s3cret")
    assert "s3cret" not in repr(conn) and str(conn) == "127.0.0.1:9093"


def test_env_round_trips_so_a_child_process_logs_in_the_same():
    conn = _secured(sasl_mechanism="SCRAM-SHA-256")
    assert KafkaConnection.from_env(conn.env()) == conn
    assert conn.as_user("billing", "x").username == "billing"


def test_client_args_carry_the_scram_login(tmp_path):

    ca = tmp_path / "ca.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=t",
                    "-keyout", str(tmp_path / "k"), "-out", str(ca)], check=True, capture_output=True)
    args = client_args(_secured(ca_file=str(ca)))
    assert args["security_protocol"] == "SASL_SSL" and args["sasl_mechanism"] == "SCRAM-SHA-512"
    assert (args["sasl_plain_username"], args["sasl_plain_password"]) == ("placer", "pw")
    assert args["ssl_context"].verify_mode.name == "CERT_REQUIRED"


def test_settings_from_flags_and_env(monkeypatch, tmp_path):
    secret = tmp_path / "pw"
    secret.write_text("from-file\n")
    monkeypatch.setenv("GPUSCHED_KAFKA_SECURITY_PROTOCOL", "sasl_ssl")
    monkeypatch.setenv("GPUSCHED_KAFKA_USER", "admission")
    monkeypatch.delenv("GPUSCHED_KAFKA_PASSWORD", raising=False)
    parser = argparse.ArgumentParser()
    KafkaSettings.add_args(parser)
    args = parser.parse_args(["--kafka-password-file", str(secret), "--kafka-ca", "/ca.pem", "--log-level", "ERROR"])
    conn = KafkaConnection.from_settings(kafka_settings(args))
    assert (conn.security_protocol, conn.username, conn.password, conn.ca_file) == \
        ("SASL_SSL", "admission", "from-file", "/ca.pem")
    args = parser.parse_args(["--kafka-ca", "", "--log-level", "ERROR"])
    with pytest.raises(SystemExit, match="needs a user, a password and a CA"):
        kafka_settings(args)


def test_load_credentials(tmp_path):
    path = tmp_path / "credentials"
    path.write_text("admin a1\nbilling b2\n\n")
    assert load_credentials(path) == {"admin": "a1", "billing": "b2"}


@pytest.mark.parametrize("brokers, expected", [(1, (1, 1)), (2, (1, 1)), (3, (3, 2)), (5, (3, 2))])
def test_replication_follows_the_cluster(brokers, expected):
    assert replication_for(brokers) == expected


def test_replication_asked_for_is_checked_against_the_cluster():
    assert replication_for(3, 2) == (2, 1)
    with pytest.raises(ValueError, match="impossible on 1 broker"):
        replication_for(1, 3)
    with pytest.raises(ValueError, match="impossible"):
        replication_for(3, 2, 3)


def test_every_topic_gets_min_insync():
    for spec in topic_specs(TopicNames("p."), 4, 3, 2):
        assert spec.replication_factor == 3 and spec.topic_configs["min.insync.replicas"] == "2"


names = TopicNames("x.")


def _ops(user: str) -> set[tuple[str, int]]:
    return {(e[1], e[5]) for e in acl_entries(names) if e[3] == f"User:{user}"}


def test_billing_and_audit_read_only():
    for user in ("billing", "audit"):
        assert not {op for _, op in _ops(user)} & {WRITE, IDEMPOTENT_WRITE}
    assert (names.events, READ) in _ops("billing")


def test_nobody_and_unknown_principals_get_nothing():
    assert "nobody" not in GRANTS and not _ops("nobody")


def test_no_shared_node_agent_login_is_granted():
    assert "node-agent" not in GRANTS and not _ops("node-agent")


def test_a_node_writes_its_own_topics_and_no_shared_one_but_dead_letters():
    node = {(e[1], e[5]) for e in node_acl_entries(names, "n1") if e[3] == "User:node-agent.n1"}
    assert len(node) == len(node_acl_entries(names, "n1"))   # all of them for that principal
    assert {("x.reports.n1", WRITE), ("x.beats.n1", WRITE)} <= node
    assert {t for t, op in node if op == WRITE} == {"x.reports.n1", "x.beats.n1", names.dead_letters}
    assert all(e[2] == 3 for e in node_acl_entries(names, "n1"))   # LITERAL only


def test_a_node_reads_the_pool_log_only_when_its_agent_folds_it():
    """The pool log holds every team's specs, commands and submitters: a node's login,
    on the machine that runs users' code, reads its work view unless told otherwise."""
    reads = {e[1] for e in node_acl_entries(names, "n1") if e[5] == READ}
    assert reads == {"x.work.n1"}
    log_reader = {e[1] for e in node_acl_entries(names, "n1", reads_log=True) if e[5] == READ}
    assert log_reader == {"x.work.n1", names.events}


def test_only_the_relays_and_the_auditor_read_every_report_topic():
    readers = {e[3] for e in acl_entries(names) if e[1] == "x.reports." and e[2] == 4 and e[5] == READ}
    assert readers == {"User:admission", "User:relay", "User:audit"}


def test_a_node_reads_its_own_work_view_and_no_other():
    node = {(e[1], e[5]) for e in node_acl_entries(names, "n1")}
    assert ("x.work.n1", READ) in node and ("x.work.n1", WRITE) not in node
    reads = {e[1] for e in acl_entries(names) + node_acl_entries(names, "n1") + node_acl_entries(names, "n2")
             if e[3] == "User:node-agent.n1" and e[5] == READ}
    assert "x.work.n2" not in reads and not any(t.startswith("x.work.") and t != "x.work.n1" for t in reads)


def test_only_the_relays_write_every_work_view():
    writers = {e[3] for e in acl_entries(names) if e[1] == "x.work." and e[2] == 4 and e[5] == WRITE}
    assert writers == {"User:admission", "User:relay"}
    assert not any(e[1] == "x.work." and e[5] == READ for e in acl_entries(names))


def test_only_the_preemptor_and_the_auditor_read_every_beats_topic():
    readers = {e[3] for e in acl_entries(names) if e[1] == "x.beats." and e[2] == 4 and e[5] == READ}
    assert readers == {"User:preemptor", "User:audit"}


def test_a_node_host_writes_only_its_own_topics_and_only_the_relays_and_preemptor_read_them():
    from gpusched.adapters.broker.kafka_acls import host_acl_entries

    entries = host_acl_entries(names, "h1")
    assert {e[3] for e in entries} == {"User:node-host.h1"}
    assert {e[1] for e in entries if e[5] == WRITE} == {"x.hostreports.h1", "x.hostbeats.h1", names.dead_letters}
    assert all(e[2] == 3 for e in entries)   # literal names only: not another host's topics
    readers = {(e[3], e[1]) for e in acl_entries(names) if e[1].startswith("x.host") and e[5] == READ}
    assert readers == {(f"User:{u}", "x.hostreports.") for u in ("admission", "relay", "audit")} | \
        {(f"User:{u}", "x.hostbeats.") for u in ("preemptor", "audit")}


def test_only_the_relays_and_preemptor_write_usage_and_heartbeats():
    writers = {e[3]: set() for e in acl_entries(names)}
    for e in acl_entries(names):
        if e[5] == WRITE and e[1] in (names.usage, names.heartbeats):
            writers[e[3]].add(e[1])
    assert {u: t for u, t in writers.items() if t} == {
        "User:admission": {names.usage}, "User:relay": {names.usage}, "User:preemptor": {names.heartbeats}}


@given(st.sampled_from(sorted(GRANTS)))
def test_acls_name_only_this_prefixs_topics_and_groups(user):
    for entry in acl_entries(names):
        if entry[3] == f"User:{user}" and entry[5] != IDEMPOTENT_WRITE:
            assert entry[1].startswith(names.prefix)
            # LITERAL, never a wildcard; PREFIXED only for the report, beats and work-view topics of this
            # prefix, the node hosts' included
            assert entry[2] == 3 or (entry[2] == 4 and entry[1] in (names.prefix + "reports.", names.prefix + "beats.",
                                                                    names.prefix + "work.", names.prefix + "hostreports.",
                                                                    names.prefix + "hostbeats."))
            assert entry[5] in (READ, WRITE, DESCRIBE, DESCRIBE_CONFIGS)


def test_local_cluster_gives_each_service_its_own_login(tmp_path):
    from gpusched.local_cluster import LocalCluster, principal_of

    (tmp_path / "credentials").write_text("admin a\nplacer p\nnode-agent.n1 n\n")
    admin = KafkaConnection("h:1", "SASL_SSL", "admin", "a", str(tmp_path / "ca.pem"))
    cluster = LocalCluster(admin, TopicNames("p."), tmp_path / "logs")
    env = cluster.kafka_env("node-agent.n1")
    assert (env["GPUSCHED_KAFKA_USER"], env["GPUSCHED_KAFKA_PASSWORD"]) == ("node-agent.n1", "n")
    assert principal_of("gpusched-placer") == "placer"
    assert cluster.kafka_env("placer")["GPUSCHED_KAFKA_PASSWORD"] == "p"
    assert "GPUSCHED_KAFKA_USER" not in LocalCluster("h:1", TopicNames("p."), tmp_path / "l2").kafka_env("placer")
