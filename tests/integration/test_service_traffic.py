"""A service under traffic, through a real nginx kept current by a real ``gpusched lb
nginx``, its replicas real model servers (tests/workloads/model_server.py) on a real
broker:

* a rolling update of 4 replicas with max_unavailable 1 loses no request: every request
  during it is answered 200, by v1 and then v2, and each answer is one the replicas
  themselves recorded serving;
* scaled to zero, the service's upstream is the activator, and a request brings one
  replica back and is answered by it;
* the preemptor's autoscaler follows the requests in flight from 1 replica to 4 under load
  and, after its scale-down window, back to 1.
"""
from __future__ import annotations

import asyncio
import json
from collections import Counter
import time
import urllib.request
from pathlib import Path

from gpusched.client import Client, spec
from gpusched.local_cluster import LocalCluster
from gpusched.ports import free_port
from gpusched.v1 import types_pb2
from tests.integration.service_rig import Load, Nginx, kill_workers_left, model_server, start_lb
from tests.polling import eventually_async


def web(records: Path, version: str, replicas: int, **fields) -> types_pb2.ServiceSpec:
    template = spec("", "", gpus=1, command=model_server("--version", version, "--ready-after", "0.5",
                                                         "--records", str(records)))
    template.serve_port = True
    template.readiness.http_path = "/healthz"
    template.readiness.period.FromMilliseconds(200)
    msg = types_pb2.ServiceSpec(name="web", team="ml", template=template, **fields)
    msg.replicas = replicas
    return msg


def served(records: Path) -> list[dict]:
    return [json.loads(line) for path in records.glob("*.jsonl") for line in path.read_text().splitlines()]


async def test_a_rolling_update_through_nginx_loses_no_request_and_a_service_at_zero_wakes_on_a_request(
        kafka_bootstrap, topics, tmp_path):
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path / "logs")
    state_dir, records = tmp_path / "node-0", tmp_path / "served"
    nginx, lb = Nginx(tmp_path / "nginx", "web"), None
    try:
        admission = await cluster.admission()
        await cluster.placer()
        await cluster.agent("node-0", "4xH100-80GB", "--run-processes", "--state-dir", str(state_dir),
                            "--address", "127.0.0.1", "--grace", "5")
        client = Client(f"127.0.0.1:{admission.port}")
        await eventually_async(lambda: _pool_known(client), "the node's pool", 30)
        update = types_pb2.UpdateStrategy(max_surge=0, max_unavailable=1)
        await client.apply_service(web(records, "v1", 4, min_replicas=0, update=update))
        activator = free_port()
        lb = start_lb(admission.port, "web", nginx, activator)
        nginx.start()
        await eventually_async(lambda: _ready(client, 4), "4 replicas ready", 90)
        await eventually_async(lambda: len(nginx.servers()) == 4, "nginx's upstream to list them", 30)
        await eventually_async(lambda: asyncio.to_thread(nginx.answers), "nginx to answer", 30)

        load = Load(f"http://127.0.0.1:{nginx.port}/", threads=4).start()
        await eventually_async(lambda: len(load.answers) >= 50, "traffic before the update", 30)
        rolled = await client.apply_service(web(records, "v2", 4, min_replicas=0, update=update))
        assert rolled.revision == 2
        await eventually_async(lambda: _rolled_out(client, 2), "revision 2 rolled out", 120)
        await eventually_async(lambda: len(nginx.servers()) == 4 and sum(b.endswith("v2\n") for _, b, _ in
                                                                         load.answers[-40:]) == 40,
                               "only v2 answering", 60)
        answers = load.stop()
        failed = [(status, body) for status, body, _ in answers if status != 200]
        assert failed == [] and len(answers) > 100
        versions = [body.split()[1] for _, body, _ in answers]
        assert "v1" in versions and versions[-1] == "v2"
        # every answer is one a replica recorded serving, and nothing more
        assert Counter(body for _, body, _ in answers) == Counter(f"{r['replica']} {r['version']}\n"
                                                                  for r in served(records))

        # to zero: the upstream is the activator; a request brings one replica back
        await client.scale_service("web", 0)
        await eventually_async(lambda: nginx.servers() == [f"127.0.0.1:{activator}"], "the activator alone", 60)
        await eventually_async(lambda: _all_ended(client), "every replica's process gone (drained)", 60)
        with urllib.request.urlopen(f"http://127.0.0.1:{nginx.port}/", timeout=120) as answer:
            status, body = answer.status, answer.read().decode()
        assert status == 200 and body.endswith("v2\n")
        service = await client.get_service("web")
        assert service.desired == 1 and "activator" in service.scaled_reason
        assert body.split()[0] in [r.job_id for r in service.replica]
    finally:
        if lb is not None:
            lb.terminate()
            lb.wait(30)
        nginx.stop()
        kill_workers_left(state_dir)
        await cluster.stop_all()


async def test_the_autoscaler_follows_requests_in_flight_up_and_after_its_window_down(kafka_bootstrap, topics, tmp_path):
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path / "logs")
    state_dir, records = tmp_path / "node-0", tmp_path / "served"
    nginx, lb = Nginx(tmp_path / "nginx", "web"), None
    try:
        admission = await cluster.admission()
        await cluster.placer()
        await cluster.preemptor()
        await cluster.agent("node-0", "4xH100-80GB", "--run-processes", "--state-dir", str(state_dir),
                            "--address", "127.0.0.1", "--grace", "5", "--usage-interval", "0.5")
        client = Client(f"127.0.0.1:{admission.port}")
        await eventually_async(lambda: _pool_known(client), "the node's pool", 30)
        scaling = types_pb2.AutoscalingPolicy(metric=types_pb2.SCALING_METRIC_REQUESTS_IN_FLIGHT, target=2)
        scaling.scale_down_window.FromSeconds(4)
        await client.apply_service(web(records, "v1", 1, min_replicas=1, max_replicas=4, autoscaling=scaling))
        lb = start_lb(admission.port, "web", nginx)
        nginx.start()
        await eventually_async(lambda: _ready(client, 1), "1 replica ready", 90)
        await eventually_async(lambda: asyncio.to_thread(nginx.answers), "nginx to answer", 30)

        load = Load(f"http://127.0.0.1:{nginx.port}/work?ms=400", threads=8).start()
        await eventually_async(lambda: _ready(client, 4), "4 replicas ready under load", 120)
        up = await client.get_service("web")
        assert up.desired == 4 and up.scaled_reason.startswith("autoscaler: requests_in_flight")
        await eventually_async(lambda: len({body.split()[0] for _, body, _ in load.answers[-40:]}) == 4,
                               "the load spread over the 4 replicas", 60)
        answers = load.stop()
        stopped = time.time()
        assert answers and all(status == 200 for status, _, _ in answers)

        await eventually_async(lambda: _desired(client, 1), "back to 1 after the window", 60)
        assert time.time() - stopped >= 4.0                                  # not before its window
        down = await client.get_service("web")
        assert down.scaled_reason.startswith("autoscaler:")
    finally:
        if lb is not None:
            lb.terminate()
            lb.wait(30)
        nginx.stop()
        kill_workers_left(state_dir)
        await cluster.stop_all()


async def _pool_known(client: Client) -> bool:
    return bool(await client.nodes())


async def _ready(client: Client, count: int) -> bool:
    return (await client.get_service("web")).ready == count


async def _desired(client: Client, count: int) -> bool:
    return (await client.get_service("web")).desired == count


async def _all_ended(client: Client) -> bool:
    ending = (types_pb2.JOB_PHASE_CANCELLED, types_pb2.JOB_PHASE_SUCCEEDED, types_pb2.JOB_PHASE_FAILED)
    return all(job.phase in ending for job in await client.list_all() if job.spec.name == "web")


async def _rolled_out(client: Client, revision: int) -> bool:
    service = await client.get_service("web")
    return (service.revision == revision and service.rollout_done and service.ready == service.desired
            and all(r.revision == revision for r in service.replica))
