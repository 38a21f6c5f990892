"""The package built from a clean copy of the checkout and installed into fresh virtual
environments outside it (tests/deployment/conftest.py): what the wheel carries, the base
install (the client and the CLI, against a running cluster; no Kafka, faust, SQLAlchemy
or matplotlib), one line naming the extra a service of another role needs, and each
role's install running its services' --help (docs/guide/deploying.md, "Packages and extras")."""
from __future__ import annotations

import tarfile

import pytest

from gpusched.local_cluster import LocalCluster
from gpusched.version import VERSION
from tests.deployment.installs import wheel_members

# Each service and tool, as a user types it, with the extra it needs.
BY_EXTRA = {
    "server": [("gpusched-admission",), ("gpusched-placer",), ("gpusched-preemptor",), ("gpusched", "relay"),
               ("gpusched", "kafka-setup")],
    "agent": [("gpusched-node-agent",), ("gpusched-node-host",)],
    "accounting": [("gpusched-billing-consumer",), ("gpusched-audit-consumer",), ("gpusched", "billing"),
                   ("gpusched", "audit"), ("gpusched", "usage")],
    "sim": [("gpusched", "simulate", "static")],
}
HEAVY = ("aiokafka", "faust-streaming", "sqlalchemy", "matplotlib", "psycopg", "psycopg-binary", "scipy")


def test_the_wheel_is_built_from_the_sdist_with_its_generated_and_compiled_parts(built_package):
    assert built_package.wheel.name == f"gpusched-{VERSION}-cp311-cp311-linux_x86_64.whl"
    members = wheel_members(built_package.wheel)
    for proto in ("admission", "cluster", "events", "node_agent", "types", "usage"):
        assert f"gpusched/v1/{proto}_pb2.py" in members and f"gpusched/v1/{proto}_pb2_grpc.py" in members
    assert "gpusched/v1/gpusched.desc" in members
    assert members["gpusched_node_agent/gpusched-shim"] & 0o111 == 0o111          # the shim, executable
    assert "gpusched/_native/SOURCES" in members                                    # the reducer, compiled
    assert any(m.startswith("gpusched/_native/gpusched/core/reducer.") and m.endswith(".so") for m in members)
    with tarfile.open(built_package.sdist) as sdist:
        names = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    assert {"proto/gpusched/v1/events.proto", "services/node-agent/shim.c", "deploy/build_parts.py",
            "setup.py"} <= names
    assert not [n for n in names if n.endswith("_pb2.py") or "gpusched-shim" in n or "_native" in n]   # sources only


def test_the_base_install_is_the_cli_and_the_client_without_kafka_faust_sqlalchemy_or_matplotlib(base_venv):
    assert not base_venv.distributions() & set(HEAVY)
    imported = base_venv.run("python", "-c", "import sys, gpusched.cli, gpusched.client\n"
                             "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))")
    assert imported.returncode == 0, imported.stderr
    top = set(imported.stdout.split())
    assert "gpusched" in top and not top & {"aiokafka", "kafka", "faust", "sqlalchemy", "matplotlib", "pydantic"}
    assert base_venv.run("gpusched", "--help").returncode == 0
    version = base_venv.run("gpusched", "version", "--verbose")
    assert version.returncode == 0, version.stderr
    lines = version.stdout.splitlines()
    assert lines[0] == f"gpusched {VERSION}" and "reducer: compiled (mypyc)" in lines
    assert f"worker shim: {base_venv.root}/lib/python3.11/site-packages/gpusched_node_agent/gpusched-shim" in lines
    assert "extra [server]: not installed (missing aiokafka" in version.stdout


@pytest.mark.parametrize("extra, command", [(extra, c) for extra, commands in BY_EXTRA.items() for c in commands])
def test_a_service_of_a_missing_extra_says_in_one_line_which_to_install(base_venv, extra, command):
    done = base_venv.run(*command, "--help")
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    (line,) = done.stderr.splitlines()
    name = command[1] if command[0] == "gpusched" else command[0].removeprefix("gpusched-")
    assert line.startswith(f"gpusched {name} needs the package's [{extra}] extra (module ")
    assert line.endswith(f"is not installed): pip install 'gpusched[{extra}]'")


async def test_the_base_install_runs_the_client_and_the_cli_against_a_cluster(base_venv, kafka_bootstrap, topics,
                                                                             tmp_path):
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path / "logs")
    try:
        admission = await cluster.admission()
        await cluster.placer()
        await cluster.agent("node-0", "2xH100-80GB")
        endpoint = f"127.0.0.1:{admission.port}"
        script = ("import sys\nfrom gpusched.client import connect, spec\nfrom gpusched.v1 import types_pb2\n"
                  "with connect(sys.argv[1]) as c:\n"
                  "    job = c.submit(spec('from-the-wheel', 'nlp', gpus=1, duration=0.5), key='wheel-1').job\n"
                  "    (done,) = c.wait_terminal({job.job_id}, 120)\n"
                  "    print(job.job_id, done.phase == types_pb2.JOB_PHASE_SUCCEEDED)\n")
        ran = base_venv.run("python", "-c", script, endpoint, timeout=180)
        assert ran.returncode == 0, ran.stderr
        job_id, succeeded = ran.stdout.split()
        assert succeeded == "True"
        listed = base_venv.run("gpusched", "--endpoint", endpoint, "get", "jobs", "-o", "wide")
        assert listed.returncode == 0, listed.stderr
        assert job_id in listed.stdout and "Succeeded" in listed.stdout
        nodes = base_venv.run("gpusched", "--endpoint", endpoint, "get", "nodes")
        assert nodes.returncode == 0 and "node-0" in nodes.stdout, nodes.stderr
    finally:
        await cluster.stop_all()


def test_the_agent_install_runs_the_node_agent_and_its_shim_without_accounting_or_the_simulator(agent_venv, tmp_path):
    assert not agent_venv.distributions() & {"faust-streaming", "sqlalchemy", "matplotlib", "psycopg", "scipy"}
    for command in BY_EXTRA["agent"]:
        done = agent_venv.run(*command, "--help")
        assert done.returncode == 0 and "usage:" in done.stdout, done.stderr
    shim = agent_venv.root / "lib" / "python3.11" / "site-packages" / "gpusched_node_agent" / "gpusched-shim"
    ran = agent_venv.run("python", "-c", "import subprocess, sys\n"
                         f"sys.exit(subprocess.run([{str(shim)!r}, '--kill-wait', '1', '--status', "
                         f"{str(tmp_path / 'shim.json')!r}, '--', 'sh', '-c', 'exit 7']).returncode)")
    assert ran.returncode == 7, ran.stderr
    assert '"exit_code": 7' in (tmp_path / "shim.json").read_text()


def test_the_server_install_runs_every_control_plane_service(server_venv):
    assert not server_venv.distributions() & {"faust-streaming", "sqlalchemy", "matplotlib", "nvidia-ml-py"}
    for command in BY_EXTRA["server"]:
        done = server_venv.run(*command, "--help")
        assert done.returncode == 0 and "usage:" in done.stdout, (command, done.stderr)


def test_the_tools_install_runs_the_accounting_consumers_the_reports_the_simulator_and_the_dashboard(tools_venv):
    for command in [*BY_EXTRA["accounting"], *BY_EXTRA["sim"], ("gpusched", "dashboard")]:
        done = tools_venv.run(*command, "--help")
        assert done.returncode == 0 and ("usage:" in done.stdout or "Usage:" in done.stdout), (command, done.stderr)
