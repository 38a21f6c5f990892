"""The broker's principals are listed once (gpusched.adapters.broker.kafka_principals): what
deploy/kafka.sh makes users of, the ACLs, the services' logins and the docs follow it."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpusched.adapters.broker.kafka_acls import GRANTS as ACL_GRANTS
from gpusched.adapters.broker.kafka_principals import (GRANTS, NAMES, PRINCIPALS, SERVICES, SUPER_USER,
                                                principal_of_command)
from gpusched.commands import COMMANDS
from gpusched.kafka_setup import SERVICES as SETUP_SERVICES
from gpusched.local_cluster import principal_of

REPO = Path(__file__).resolve().parents[3]


def test_the_printed_list_is_the_table_and_needs_nothing_installed(tmp_path):
    """As deploy/kafka.sh runs it: from the checkout, with no site-packages (-S), so
    neither the package nor its dependencies need to be installed."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-S", "-m", "gpusched.adapters.broker.kafka_principals"], env=env, cwd=tmp_path,
                         capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == list(NAMES) == [p.name for p in PRINCIPALS]
    assert len(set(NAMES)) == len(NAMES) and all(re.fullmatch(r"[a-z][a-z0-9-]*", n) for n in NAMES)


def test_kafka_sh_takes_its_users_from_the_package():
    script = (REPO / "deploy" / "kafka.sh").read_text()
    assert "-m gpusched.adapters.broker.kafka_principals" in script
    assert f"super.users=User:{SUPER_USER};" in script   # the admin it logs in as, and the brokers


def test_the_acls_and_kafka_setup_are_generated_from_the_table():
    assert ACL_GRANTS is GRANTS
    assert SETUP_SERVICES == SERVICES == tuple(p.name for p in PRINCIPALS if p.grant is not None)
    assert SUPER_USER not in GRANTS and "nobody" in NAMES and "nobody" not in GRANTS


def test_every_command_in_the_table_is_a_gpusched_command_of_one_principal():
    commands = [c for p in PRINCIPALS for c in p.commands]
    assert len(commands) == len(set(commands))
    assert set(commands) <= COMMANDS.keys()


@pytest.mark.parametrize("command, args, principal", [
    ("gpusched-admission", ("--listen", "127.0.0.1:0"), "admission"),
    ("gpusched-placer", (), "placer"),
    ("gpusched-preemptor", (), "preemptor"),
    ("gpusched", ("relay",), "relay"),
    ("gpusched-billing-consumer", (), "billing"),
    ("gpusched-audit-consumer", (), "audit"),
    ("gpusched", ("usage",), "audit"),
])
def test_every_service_command_of_the_local_cluster_logs_in_as_a_principal_of_the_table(command, args, principal):
    assert principal_of(command, *args) == principal and principal in NAMES


def test_a_command_without_a_principal_is_refused_rather_than_given_one():
    with pytest.raises(ValueError, match="no Kafka principal logs in as gpusched demo"):
        principal_of("gpusched", "demo")
    assert principal_of_command("node-agent") is None   # each node logs in as its own


def test_the_systemd_units_log_in_as_their_commands_principal():
    checked = 0
    for env_file in sorted((REPO / "deploy" / "systemd" / "env").glob("*.env")):
        user = re.search(r"^GPUSCHED_KAFKA_USER=(\S+)$", env_file.read_text(), re.M)
        if user and env_file.stem not in ("node-agent", "node-host"):
            assert user.group(1) == principal_of_command(env_file.stem), env_file.name
            checked += 1
    assert checked >= 6


def test_the_docs_table_and_example_name_the_same_principals():
    doc = (REPO / "docs" / "reference" / "kafka-security.md").read_text()
    table = doc.split("## Principals and ACLs", 1)[1].split("\n\n")
    rows = next(part for part in table if part.startswith("| principal |"))
    named = [m for m in re.findall(r"^\| `([^`]+)` \|", rows, re.M) if "<" not in m]
    assert sorted(named) == sorted(NAMES)
    deploying = (REPO / "docs" / "guide" / "deploying.md").read_text()
    # the set-up example, once per deployment: every service's login
    [example] = [block for block in deploying.split("```")[1::2] if "gpusched kafka-setup --service" in block]
    assert re.findall(r"--service (\w+)", example) == list(SERVICES)
