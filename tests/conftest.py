"""Shared pytest fixtures: a real Kafka broker for the tests that need one.

* ``kafka_bootstrap`` (session): the cluster, as a ``KafkaConnection`` logged in as the
  admin (``str()`` of it is the bootstrap address). Uses ``KAFKA_BOOTSTRAP_SERVERS``
  (and ``GPUSCHED_KAFKA_*``, see gpusched.adapters.broker.kafka_security) when set; otherwise
  starts a private broker with ``deploy/kafka.sh`` on a free loopback port pair (or
  ``GPUSCHED_TEST_KAFKA_PORT``) with its data in ``.run/test-kafka-<port>``, and stops
  it at session end. The run dir is deleted afterwards unless a test failed (its logs
  are kept then). Separate ports and dirs per session let several test runs share a
  machine. The broker is secured (SASL_SSL, SCRAM-SHA-512, ACLs) as production would
  run it; ``GPUSCHED_TEST_KAFKA_SECURITY=plaintext`` starts a plaintext one instead.
* ``kafka_credentials`` (session): SCRAM user -> password of the secured broker (empty
  for a plaintext one); ``LocalCluster`` gives each service its own.
* ``topics`` (function): a fresh, unique set of topics (``TopicNames``) per test, with
  the services' ACLs on a secured broker, deleted again afterwards with the nodes'
  report topics. Each node-agent gets its own login (``node-agent.<node>``) and report
  topic from ``LocalCluster.agent`` (gpusched.adapters.nodes.node_access.add_node).
* ``kafka_control`` (function): stop/kill/start the broker (only the broker this
  file started; skips with KAFKA_BOOTSTRAP_SERVERS). A test that leaves the
  broker down gets it restarted at teardown.

Any test using these fixtures is marked ``broker`` automatically, so
``pytest -m "not broker"`` runs without Java/Kafka.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
from pathlib import Path

import pytest

from gpusched.adapters.broker.kafka_acls import grant_service_acls
from gpusched.adapters.broker.kafka_admin import TopicNames, delete_topics, ensure_topics
from gpusched.adapters.broker.kafka_security import KafkaConnection
from gpusched.ports import free_port, free_ports
from tests.kafka_control import REPO, KafkaControl, note_cluster

_BROKER_FIXTURES = {"kafka_bootstrap", "topics", "kafka_control", "kafka_credentials"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _BROKER_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.broker)


@pytest.fixture(scope="session")
def _kafka_session(request: pytest.FixtureRequest) -> KafkaControl:
    if os.environ.get("GPUSCHED_TESTCONTAINERS") == "1":
        yield from _testcontainers_broker()
        return
    external = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if external:
        control = KafkaControl(external, managed=False)
        control.start()  # with KAFKA_BOOTSTRAP_SERVERS set this only checks it answers
        yield control
        return
    port = int(os.environ.get("GPUSCHED_TEST_KAFKA_PORT") or free_ports(2, "the test broker"))
    run_dir = REPO / ".run" / f"test-kafka-{port}"
    control = KafkaControl(f"127.0.0.1:{port}", managed=True, port=port, run_dir=run_dir)
    control.run("clean")  # fresh cluster (also stops a leftover broker on that dir)
    note_cluster(port, run_dir, 1)
    control.start()
    try:
        yield control
    finally:
        control.stop()
        if request.session.testsfailed == 0:
            shutil.rmtree(run_dir, ignore_errors=True)


def _testcontainers_broker():
    """Optional path for machines with a Docker engine (not ours): a KRaft broker in a
    container. Tests that restart the broker skip, as with an external cluster."""
    from testcontainers.kafka import KafkaContainer   # pip install '.[docker]'

    with KafkaContainer(os.environ.get("GPUSCHED_KAFKA_IMAGE", "apache/kafka:4.1.0")).with_kraft() as kafka:
        yield KafkaControl(kafka.get_bootstrap_server(), managed=False)


@pytest.fixture(scope="session")
def kafka_bootstrap(_kafka_session: KafkaControl) -> KafkaConnection:
    return _kafka_session.bootstrap


@pytest.fixture(scope="session")
def kafka_credentials(_kafka_session: KafkaControl) -> dict[str, str]:
    return _kafka_session.credentials


@pytest.fixture
def kafka_control(_kafka_session: KafkaControl) -> KafkaControl:
    if not _kafka_session.managed:
        pytest.skip("broker comes from KAFKA_BOOTSTRAP_SERVERS; tests cannot stop/start it")
    yield _kafka_session
    if not _kafka_session.running:  # the test left it down (failed mid-way?)
        _kafka_session.start()


@pytest.fixture
async def topics(request: pytest.FixtureRequest, kafka_bootstrap: KafkaConnection) -> TopicNames:
    name = re.sub(r"[^A-Za-z0-9]+", "-", request.node.name).strip("-")[:60]
    names = TopicNames(f"t-{name}-{secrets.token_hex(3)}.")
    await ensure_topics(kafka_bootstrap, names)
    if kafka_bootstrap.secured:
        await grant_service_acls(kafka_bootstrap, names)
    yield names
    await delete_topics(kafka_bootstrap, names, timeout_s=10)   # best effort: no piling up partitions


# --- PostgreSQL: the accounting database's production option (docs/guide/audit-billing.md) ---
def _postgres_bindir() -> Path:
    """Debian's PostgreSQL server binaries (deploy/setup.sh installs the package)."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parent.parent.name))
    if found:
        return found[-1].parent
    on_path = shutil.which("initdb")
    if on_path:
        return Path(on_path).resolve().parent
    pytest.fail("PostgreSQL's initdb was not found: run deploy/setup.sh (installs Debian's postgresql)")


@pytest.fixture(scope="session")
def postgres_server():
    """A PostgreSQL server of its own on a free loopback port, in a temp dir, stopped at
    teardown. As root, the server runs as the ``postgres`` system user (initdb refuses
    root). Yields a URL of its maintenance database; ``postgres_url`` makes one per test."""
    import pwd
    import tempfile

    bindir = _postgres_bindir()
    root = Path(tempfile.mkdtemp(prefix="gpusched-pg-"))
    as_user: list[str] = []
    if os.geteuid() == 0:
        as_user = ["runuser", "-u", "postgres", "--"]
        pw = pwd.getpwnam("postgres")
        os.chown(root, pw.pw_uid, pw.pw_gid)
    data, port = root / "data", free_ports(1, "the test broker")
    subprocess.run([*as_user, str(bindir / "initdb"), "-D", str(data), "-U", "gpusched", "--auth=trust",
                    "-E", "UTF8", "--no-sync"], check=True, capture_output=True)
    options = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off"
    subprocess.run([*as_user, str(bindir / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(root / "log"),
                    "-w", "-t", "60", "start"], check=True, capture_output=True)
    try:
        yield f"postgresql://gpusched@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*as_user, str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"],
                       capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def postgres_url(postgres_server: str) -> str:
    """A fresh database on the session's server."""
    import psycopg

    name = f"t_{secrets.token_hex(4)}"
    with psycopg.connect(postgres_server, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return postgres_server.rsplit("/", 1)[0] + "/" + name


# --- observability back-ends: a real Jaeger and a real Prometheus ----------------------
# ``jaeger`` and ``prometheus`` (session) run the binaries deploy/observability.sh builds
# (it is run here, and builds what is missing), each on free loopback ports with its data
# under the session's temporary folder, and stop them at session end.

OBSERVABILITY_SH = REPO / "deploy" / "observability.sh"


@pytest.fixture(scope="session")
def observability_bin() -> Path:
    subprocess.run(["bash", str(OBSERVABILITY_SH), "fetch"], check=True)
    out = subprocess.run(["bash", str(OBSERVABILITY_SH), "path"], check=True, capture_output=True, text=True)
    return Path(out.stdout.strip())


class Backend:
    """A back-end process, its log, and the URL of its HTTP API."""

    def __init__(self, argv: list[str], log_path: Path, url: str, ready_path: str) -> None:
        self.log_path = log_path
        self.url = url
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT)
        self._wait_ready(ready_path)

    def _wait_ready(self, path: str, timeout: float = 120.0) -> None:
        import urllib.request
        from tests.polling import eventually

        def answered() -> str | None:   # the process is starting: nothing to await but its port
            if self.proc.poll() is not None:
                return "exited"
            try:
                with urllib.request.urlopen(self.url + path, timeout=2) as answer:
                    return "ready" if answer.status == 200 else None
            except OSError:
                return None
        try:
            if eventually(answered, f"{self.log_path.name} ready", timeout, poll=0.2) == "ready":
                return
        except AssertionError:
            pass
        self.stop()
        raise RuntimeError(f"{self.log_path.name}: not ready:\n{self.log_path.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


JAEGER_CONFIG = """\
service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
extensions:
  jaeger_query:
    storage:
      traces: memory_store
    http:
      endpoint: 127.0.0.1:{query}
    grpc:
      endpoint: 127.0.0.1:{query_grpc}
  jaeger_storage:
    backends:
      memory_store:
        memory:
          max_traces: 100000
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 127.0.0.1:{otlp}
processors:
  batch:
    timeout: 100ms
exporters:
  jaeger_storage_exporter:
    trace_storage: memory_store
"""


@pytest.fixture(scope="session")
def jaeger(observability_bin: Path, tmp_path_factory: pytest.TempPathFactory):
    """Jaeger v2 (in-memory storage): ``.otlp_endpoint`` receives spans over OTLP/gRPC,
    ``.url`` is its query API."""
    folder = tmp_path_factory.mktemp("jaeger")
    otlp, query = free_port(), free_port()
    config = folder / "config.yaml"
    config.write_text(JAEGER_CONFIG.format(otlp=otlp, query=query, query_grpc=free_port()))
    backend = Backend([str(observability_bin / "jaeger"), "--config", str(config)], folder / "jaeger.log",
                      f"http://127.0.0.1:{query}", "/api/services")
    backend.otlp_endpoint = f"http://127.0.0.1:{otlp}"
    yield backend
    backend.stop()


@pytest.fixture(scope="session")
def prometheus(observability_bin: Path, tmp_path_factory: pytest.TempPathFactory):
    """Prometheus scraping every second the targets written to ``.targets_file``
    (file service discovery: a test lists its services' /metrics addresses there)."""
    folder = tmp_path_factory.mktemp("prometheus")
    targets = folder / "targets.json"
    targets.write_text("[]")
    config = folder / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: gpusched\n"
        f"    file_sd_configs: [{{files: ['{targets}'], refresh_interval: 1s}}]\n")
    port = free_port()
    backend = Backend([str(observability_bin / "prometheus"), f"--config.file={config}",
                       f"--storage.tsdb.path={folder / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                      folder / "prometheus.log", f"http://127.0.0.1:{port}", "/-/ready")
    backend.targets_file = targets
    yield backend
    backend.stop()
