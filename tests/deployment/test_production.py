"""A production deployment on one machine, set up as docs/guide/deploying.md says: three Kafka
brokers with SASL_SSL and ACLs (deploy/kafka.sh), the deployment's topics, ACLs and
logins made by ``gpusched kafka-setup`` as the Kafka admin, and every service started
with exactly the command and environment its systemd unit gives it (deploy/systemd; the
shipped environment files with this machine's hosts, paths and ports: tests/deployment/
units.py) from the wheel installed per role: two admission replicas behind nginx
(deploy/nginx), two placers, a preemptor, the relay from ``[server]``, and a node-agent
from ``[agent]`` that runs real processes through the wheel's shim (on simulated GPUs:
the one line added to its environment file, with the preemptor's ``--min-runtime 0
--max-loss-per-wait inf``).

The units pass ``systemd-analyze verify``; a job runs through the load balancer; the API
stays up while the admission replicas restart one at a time onto a new Kafka login and a
new API token; every query of the Grafana dashboard (deploy/grafana) names metrics the
running services export, and a real Prometheus scraping them evaluates each."""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gpusched.client import Client, ClientTls, spec
from gpusched.local_cluster import Service
from gpusched.ports import free_port, free_ports
from gpusched.v1 import types_pb2
from tests.kafka_control import start_private_cluster
from tests.deployment.units import UNITS, Site, read_env_file
from tests.polling import eventually

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "deploy" / "grafana" / "gpusched.json"
NGINX_CONF = REPO / "deploy" / "nginx" / "gpusched-admission.conf"
SERVER_UNITS = {"admission": "gpusched-admission@.service", "placer": "gpusched-placer@.service",
                "preemptor": "gpusched-preemptor@.service", "relay": "gpusched-relay@.service"}
NODE = "node-1"
POOL = "h100"          # the example node's pool (deploy/systemd/env/node-agent.env)
SUCCEEDED = types_pb2.JOB_PHASE_SUCCEEDED


@dataclass
class Deployment:
    site: Site
    admin_env: dict[str, str]
    server_venv: object
    agent_venv: object
    logs: Path
    services: dict[str, Service] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)      # "admission@1" -> its API port
    metrics: dict[str, int] = field(default_factory=dict)    # "admission@1" -> its /metrics port
    endpoint: str = ""                                       # the load balancer
    token: str = ""                                          # an operator's API token
    nginx: subprocess.Popen | None = None

    def client(self, token: str = "") -> Client:
        return Client(self.endpoint, ClientTls.from_files(self.site.etc / "tls" / "ca.pem"), token or self.token)

    async def start(self, name: str, unit: str, instance: str, venv) -> Service:
        """``name``'s service as its unit starts it: its command, only its environment."""
        argv, env = self.site.service(unit, instance, venv.root)
        clean = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(self.site.var), **env}
        log = open(self.logs / f"{name}.log", "ab")
        proc = await asyncio.create_subprocess_exec(*argv, env=clean, stdout=asyncio.subprocess.PIPE, stderr=log,
                                                    cwd=self.site.var)
        service = self.services[name] = Service(name, proc, log_path=self.logs / f"{name}.log")
        try:
            service.ready_line = await asyncio.wait_for(_ready(proc), 120)
        except (asyncio.TimeoutError, EOFError):
            await service.kill9()
            raise AssertionError(f"{name} did not start:\n{service.log_path.read_text()[-3000:]}") from None
        service._drain = asyncio.create_task(proc.stdout.read())
        return service

    def kafka_setup(self, *args: str) -> str:
        done = self.server_venv.run("gpusched", "kafka-setup", *args, env=self.admin_env, timeout=180)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout


async def _ready(proc) -> str:
    while True:
        line = await proc.stdout.readline()
        if not line:
            raise EOFError("exited before ready")
        if b" ready" in line:
            return line.decode().strip()


@pytest.fixture(scope="module")
def three_brokers(request):
    yield from start_private_cluster(3, request)


@pytest.fixture(scope="module")
async def deployment(three_brokers, server_venv, agent_venv, tmp_path_factory):
    root = tmp_path_factory.mktemp("production")
    site = Site(etc=root / "etc", var=root / "var", brokers=three_brokers.connection.bootstrap, node=NODE,
                extra={"--pool h100": "--pool h100 --simulate 2xH100-80GB --run-processes",
                       "--heartbeat-timeout 30": "--heartbeat-timeout 30 --min-runtime 0 --max-loss-per-wait inf"})
    for folder in (site.etc / "kafka", site.etc / "tls", site.etc / "api", site.var / "gpusched-node", root / "logs"):
        folder.mkdir(parents=True)
    # What an operator puts in /etc/gpusched: the brokers' CA, this host's API certificate,
    # the API's tokens and policy (a throwaway CA here: gpusched.adapters.broker.dev_pki).
    shutil.copy(Path(three_brokers.connection.ca_file), site.etc / "kafka" / "ca.pem")
    pki = root / "pki"
    subprocess.run([sys.executable, "-m", "gpusched.adapters.broker.dev_pki", str(pki), "--operator", "ops"], check=True,
                   capture_output=True)
    for name, where in (("ca.pem", "tls"), ("server.pem", "tls"), ("server-key.pem", "tls"), ("tokens.csv", "api"),
                        ("policy.json", "api")):
        shutil.copy(pki / name, site.etc / where / name)
    token = next(line.split(",")[0] for line in (pki / "tokens.csv").read_text().splitlines()
                 if line.endswith(",ops"))
    deployment = Deployment(site, {}, server_venv, agent_venv, root / "logs", token=token)
    site.env_file("cluster.env", 0, 0)
    # 14 ports in one free block: ports the kernel picks one by one, each released before
    # the next is asked for, can come back twice (a relay's metrics on a preemptor's listener)
    block = iter(range(free_ports(14, "the deployment's listeners"), 1 << 16))
    for name in ("admission", "placer", "preemptor", "relay", "node-agent"):
        key = name if name == "node-agent" else f"{name}@1"
        deployment.metrics[key], deployment.ports[key] = next(block), next(block)
        site.env_file(f"{name}.env", deployment.metrics[key], deployment.ports[key])
    for service in ("admission", "placer"):   # a second replica on this host: its own ports (the unit's @2 file)
        deployment.metrics[f"{service}@2"], deployment.ports[f"{service}@2"] = next(block), next(block)
        args = (site.etc / f"{service}.env").read_text().split(f"{service.upper()}_ARGS=")[1].splitlines()[0]
        args = re.sub(r"--listen 127\.0\.0\.1:\d+", f"--listen 127.0.0.1:{deployment.ports[f'{service}@2']}", args)
        (site.etc / f"{service}@2.env").write_text(f"{service.upper()}_ARGS={args}\n"
                                                   f"GPUSCHED_METRICS_PORT={deployment.metrics[f'{service}@2']}\n")
    # The deployment's topics, ACLs and logins, as the Kafka admin (docs/guide/deploying.md).
    deployment.admin_env = {**read_env_file(site.etc / "cluster.env"), "GPUSCHED_KAFKA_USER": "admin",
                            "GPUSCHED_KAFKA_PASSWORD": three_brokers.credentials["admin"]}
    deployment.kafka_setup("--service", "admission", "--service", "placer", "--service", "preemptor",
                           "--service", "relay", "--node", NODE, "--secrets", str(site.etc / "kafka"))
    try:
        for name, instance in (("admission", "1"), ("admission", "2"), ("placer", "1"), ("placer", "2"),
                               ("preemptor", "1"), ("relay", "1")):
            await deployment.start(f"{name}@{instance}", SERVER_UNITS[name], instance, server_venv)
        await deployment.start("node-agent", "gpusched-node-agent.service", "", agent_venv)
        deployment.endpoint, deployment.nginx = start_nginx(root / "nginx", deployment.ports)
        yield deployment
    finally:
        if deployment.nginx is not None:
            deployment.nginx.terminate()
            deployment.nginx.wait(30)
        await asyncio.gather(*(service.terminate() for service in deployment.services.values()))


def start_nginx(root: Path, ports: dict[str, int]) -> tuple[str, subprocess.Popen]:
    """nginx with the shipped stream configuration, its upstreams the two replicas here."""
    root.mkdir()
    listen = free_port()
    conf = NGINX_CONF.read_text().replace("admission-1.example.org:50051", f"127.0.0.1:{ports['admission@1']}")
    conf = conf.replace("admission-2.example.org:50051", f"127.0.0.1:{ports['admission@2']}")
    conf = conf.replace("listen 50051;", f"listen 127.0.0.1:{listen};")
    (root / "gpusched-admission.conf").write_text(conf)
    (root / "nginx.conf").write_text(
        "load_module /usr/lib/nginx/modules/ngx_stream_module.so;\n"
        f"worker_processes 1;\npid {root}/nginx.pid;\nerror_log {root}/error.log;\n"
        "events { worker_connections 256; }\n"
        f"include {root}/gpusched-admission.conf;\n")
    proc = subprocess.Popen([shutil.which("nginx") or "/usr/sbin/nginx", "-c", str(root / "nginx.conf"), "-p", str(root),
                             "-g", "daemon off;"], stderr=open(root / "stderr.log", "wb"))

    def accepting() -> bool:
        assert proc.poll() is None, (root / "stderr.log").read_text()
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", listen)) == 0
    eventually(accepting, "nginx to listen", timeout=30)
    return f"127.0.0.1:{listen}", proc


# --- the units ------------------------------------------------------------------------
def test_the_units_pass_systemd_analyze_verify(server_venv, agent_venv, tmp_path):
    """Each unit as shipped but for its install prefix, which must exist for verify: the
    venv of its role (the node-agent's [agent], the rest [server] and the tools)."""
    units = sorted(UNITS.glob("*.service"))
    assert {u.name for u in units} >= {"gpusched-admission@.service", "gpusched-placer@.service",
                                       "gpusched-preemptor@.service", "gpusched-relay@.service",
                                       "gpusched-node-agent.service", "gpusched-billing-consumer.service",
                                       "gpusched-audit-consumer.service", "gpusched-dashboard.service"}
    for unit in units:
        venv = agent_venv if "node-agent" in unit.name else server_venv
        for needed in re.findall(r"/opt/gpusched/bin/(\S+)", unit.read_text()):
            if not Path(venv.bin(needed)).exists():   # the tools' commands live in the server venv's gpusched
                pytest.fail(f"{unit.name}: {needed} is not a command of the package")
        (tmp_path / unit.name).write_text(unit.read_text().replace("/opt/gpusched", str(venv.root)))
        done = subprocess.run(["systemd-analyze", "verify", "--man=no", str(tmp_path / unit.name)],
                              capture_output=True, text=True, timeout=60, cwd=tmp_path)
        # a warning (an unknown key, a value it ignores) fails it too, not only an error
        assert done.returncode == 0 and not done.stdout.strip() and not done.stderr.strip(), (unit.name, done.stderr)


# --- the running deployment -----------------------------------------------------------
async def test_a_job_runs_through_the_load_balancer_as_a_real_process_under_the_wheels_shim(deployment):
    client = deployment.client()
    try:
        job = (await client.submit(spec("through-the-balancer", "nlp", gpus=1, pool=POOL,
                                        command=("sh", "-c", "exit 0")))).job
        (done,) = await client.wait_terminal({job.job_id}, 120)
        assert done.phase == SUCCEEDED, done.reason
        nodes = {n.info.name: n for n in await client.nodes(POOL)}
        assert nodes[NODE].status == types_pb2.NODE_STATUS_READY
    finally:
        await client.close()
    statuses = list((deployment.site.var / "gpusched-node").glob(f"{job.job_id}-*/shim.json"))
    assert statuses and json.loads(statuses[0].read_text())["exit_code"] == 0   # the wheel's shim ran it


async def test_admission_replicas_restart_one_at_a_time_onto_a_new_login_and_token_and_the_api_stays_up(deployment):
    """The rolling restart of docs/guide/deploying.md: a new Kafka credential for admission of
    the other SCRAM mechanism (the one in use keeps working meanwhile) and a second API
    token; each replica stops and starts again with them while jobs are submitted
    through the load balancer."""
    site = deployment.site
    new_secrets = site.etc / "kafka-next"
    out = deployment.kafka_setup("--service", "admission", "--scram-mechanism", "SCRAM-SHA-256",
                                 "--secrets", str(new_secrets))
    assert "service admission: SCRAM-SHA-256 credential" in out
    with open(site.etc / "admission.env", "a") as env:
        env.write(f"GPUSCHED_KAFKA_SASL_MECHANISM=SCRAM-SHA-256\nGPUSCHED_KAFKA_PASSWORD_FILE={new_secrets}/admission\n")
    new_token = "rotated-" + os.urandom(8).hex()
    with open(site.etc / "api" / "tokens.csv", "a") as tokens:
        tokens.write(f"{new_token},ops\n")
    client = deployment.client()
    submitted = []
    try:
        for replica in ("1", "2"):
            await deployment.services[f"admission@{replica}"].terminate()
            submitted.append((await client.submit(spec(f"while-{replica}-is-down", "nlp", gpus=1, pool=POOL,
                                                       command=("sleep", "0.2")))).job.job_id)
            started = await deployment.start(f"admission@{replica}", SERVER_UNITS["admission"], replica,
                                             deployment.server_venv)
            assert started.alive
        log = deployment.services["admission@1"].log_path.read_text()
        assert "refused the login" not in log
        done = await client.wait_terminal(set(submitted), 120)
        assert {j.phase for j in done} == {SUCCEEDED}, [(j.spec.name, j.reason) for j in done]
    finally:
        await client.close()
    rotated = deployment.client(new_token)   # the new token, now known to every replica
    try:
        job = (await rotated.submit(spec("with-the-new-token", "nlp", gpus=1, pool=POOL, command=("true",)))).job
        (done,) = await rotated.wait_terminal({job.job_id}, 120)
        assert done.phase == SUCCEEDED, done.reason
    finally:
        await rotated.close()


# --- the Grafana dashboard --------------------------------------------------------------
async def running(client: Client, job_id: str) -> None:
    async with contextlib.aclosing(client.watch(job_id=job_id)) as updates:
        async for update in updates:
            if update.job.phase == types_pb2.JOB_PHASE_RUNNING:
                return


def dashboard_queries() -> list[str]:
    board = json.loads(DASHBOARD.read_text())
    queries = [target["expr"] for panel in board["panels"] for target in panel["targets"]]
    queries += [v["query"]["query"] for v in board["templating"]["list"] if v["type"] == "query"]
    return queries


def metric_names(text: str) -> set[str]:
    return set(re.findall(r"\bgpusched_[a-z0-9_]+", text))


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        return answer.read().decode()


async def test_every_grafana_query_names_metrics_the_services_export_and_prometheus_evaluates_it(
        deployment, prometheus):
    """What the panels show happens first: a job waits (in a pool without nodes), one is
    preempted for a higher class, a call fails (NOT_FOUND), jobs are placed and measured."""
    client = deployment.client()
    try:
        await client.create_pool("reserved")
        await client.submit(spec("waits", "vision", gpus=1, pool="reserved"))
        victim = (await client.submit(spec("filler", "vision", gpus=2, pool=POOL, command=("sleep", "600"),
                                           priority="best-effort"))).job.job_id
        await asyncio.wait_for(running(client, victim), 60)   # started: preemptible now (--min-runtime 0)
        urgent = (await client.submit(spec("urgent", "search", gpus=2, pool=POOL, command=("sleep", "30"),
                                           priority="production-inference"))).job.job_id
        with pytest.raises(Exception, match="NOT_FOUND"):
            await client.get("job-that-does-not-exist")
        wanted = set().union(*(metric_names(q) for q in dashboard_queries()))
        assert wanted, "the dashboard names no metric"
        ports = {name: port for name, port in deployment.metrics.items() if not name.startswith("cluster")}

        def exported() -> set[str]:
            return set().union(*(metric_names(scrape(port)) for port in ports.values()))
        # the node-agent samples usage every 15 s (its environment file): up to a minute
        found = await asyncio.to_thread(eventually, lambda: wanted <= (seen := exported()) and seen,
                                        "every metric of the dashboard in the services' /metrics", 90, 1.0)
        assert wanted <= found, wanted - found
        await asyncio.wait_for(running(client, urgent), 120)   # the preemption made room for it
    finally:
        await client.close()
    prometheus.targets_file.write_text(json.dumps([{"targets": [f"127.0.0.1:{p}" for p in ports.values()]}]))

    def query(promql: str) -> list:
        url = f"{prometheus.url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
        if promql.startswith("label_values("):   # Grafana's, not PromQL: the series it reads
            metric = re.match(r"label_values\((\w+),", promql).group(1)
            url = f"{prometheus.url}/api/v1/series?{urllib.parse.urlencode({'match[]': metric})}"
        with urllib.request.urlopen(url, timeout=10) as answer:
            got = json.loads(answer.read())
        assert got["status"] == "success", (promql, got)
        return got["data"] if promql.startswith("label_values(") else got["data"]["result"]

    first = 'max by (pool) (gpusched_gpus_allocated{state="total", pool="h100"})'   # the first panel's, scraped
    assert await asyncio.to_thread(eventually, lambda: (r := query(first)) and float(r[0]["value"][1]),
                                   "Prometheus to scrape the pool's GPUs", 60, 0.5) == 2.0
    for promql in dashboard_queries():
        query(promql.replace("$__rate_interval", "1m").replace("$pool", ".*"))
