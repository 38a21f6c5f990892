"""A service started where no broker answers stops with one line naming the setting to
check, instead of the Kafka client's connection error every half second and then a
traceback (real processes; no broker on purpose)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent


def closed_port() -> int:
    with socket.socket() as s:   # bound then closed: nothing listens there
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("command", ["gpusched-admission", "gpusched-placer", "gpusched-preemptor"])
def test_a_service_without_a_broker_stops_with_one_line_that_says_what_to_check(command, tmp_path):
    bootstrap = f"127.0.0.1:{closed_port()}"
    env = {**os.environ, "GPUSCHED_INSECURE": "1", "KAFKA_BOOTSTRAP_SERVERS": bootstrap}
    env.pop("GPUSCHED_KAFKA_SECURITY_PROTOCOL", None)
    done = subprocess.run([str(BIN / command), "--broker-wait", "2", "--topic-prefix", "t-nobroker."],
                          env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode != 0
    err = done.stderr
    assert "Traceback" not in err, err
    assert f"no Kafka broker answered at {bootstrap} within 2s" in err and "--bootstrap" in err, err
    assert len([line for line in err.splitlines() if "ERROR" in line]) <= 1, err


def test_a_negative_broker_wait_is_refused_naming_the_flag(tmp_path):
    done = subprocess.run([str(BIN / "gpusched-placer"), "--broker-wait", "-1"], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path, env={**os.environ, "GPUSCHED_INSECURE": "1"})
    assert done.returncode != 0 and "--broker-wait" in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_a_placement_argument_the_policy_does_not_take_is_refused_by_name(tmp_path):
    """Checked at start, before any broker is needed: the placer names the argument."""
    env = {**os.environ, "GPUSCHED_INSECURE": "1", "KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{closed_port()}"}
    done = subprocess.run([str(BIN / "gpusched-placer"), "--placement", "fgd", "--placement-arg", "patience=0.2",
                           "--broker-wait", "2"], capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env)
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    assert "placement policy 'fgd' has no argument 'patience'" in done.stderr, done.stderr
    assert "--placement-arg" in done.stderr, done.stderr


# The node-agent with its shim binary pointed away (as where the package was built without
# a C compiler): the real entry point, in a process of its own.
AGENT_WITHOUT_SHIM = ("import sys\nfrom pathlib import Path\n"
                      "from gpusched_node_agent import main, shim_process\n"
                      "shim_process.BINARY = Path(sys.argv[1])\n"
                      "main.main(sys.argv[2:])\n")


@pytest.mark.parametrize("run_processes", [True, False])
def test_a_node_agent_without_its_worker_shim_stops_at_start_saying_what_to_do(run_processes, tmp_path):
    """Real workloads need the compiled shim: the agent says so in one line before it does
    anything else; a simulated node runs no process and starts without it (here it then
    finds no broker)."""
    env = {**os.environ, "GPUSCHED_INSECURE": "1", "KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{closed_port()}"}
    env.pop("GPUSCHED_KAFKA_SECURITY_PROTOCOL", None)
    args = ["--name", "n1", "--simulate", "1xH100-80GB", "--broker-wait", "2", "--topic-prefix", "t-noshim.",
            "--state-dir", str(tmp_path / "state"), *(["--run-processes"] if run_processes else [])]
    done = subprocess.run([sys.executable, "-c", AGENT_WITHOUT_SHIM, str(tmp_path / "gpusched-shim"), *args],
                          env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    if run_processes:
        assert done.stderr.splitlines() == [
            f"gpusched-node-agent: the worker shim {tmp_path / 'gpusched-shim'} is not built: install a C compiler "
            "and reinstall the package (pip install --force-reinstall --no-binary gpusched 'gpusched[agent]'), "
            "or run deploy/setup.sh in a checkout"], done.stderr
        assert not (tmp_path / "state").exists()   # stopped before anything else
    else:
        assert "shim" not in done.stderr and "no Kafka broker answered" in done.stderr, done.stderr
