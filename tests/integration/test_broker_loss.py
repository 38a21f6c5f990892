"""The broker lost under running services: one warning each that it is unreachable, not
the Kafka client's reconnect errors every half second; one line when it is back; and the
cluster schedules again. On a broker of this module's own, never the shared one."""
from __future__ import annotations

import asyncio
import secrets

import pytest

from gpusched.adapters.broker.kafka_acls import grant_service_acls
from gpusched.adapters.broker.kafka_admin import TopicNames, delete_topics, ensure_topics
from gpusched.client import Client, spec
from gpusched.local_cluster import LocalCluster
from tests.kafka_control import start_private_cluster
from tests.integration.cluster_calls import SUCCEEDED
from tests.polling import eventually_async

pytestmark = pytest.mark.broker
PARTITIONS = 2
DOWN_S = 12.0   # the Kafka client would log ~24 reconnect errors per connection in this time


@pytest.fixture(scope="module")
def own_broker(request):
    yield from start_private_cluster(1, request)


@pytest.fixture
async def own_topics(own_broker):
    names = TopicNames(f"t-brokerloss-{secrets.token_hex(3)}.")
    await ensure_topics(own_broker.connection, names, PARTITIONS)
    await grant_service_acls(own_broker.connection, names)
    yield names
    await delete_topics(own_broker.connection, names, timeout_s=10)


async def _run_a_job(client: Client, name: str) -> None:
    job = (await client.submit(spec(name, "team-a", gpus=1, duration=0.1))).job
    (done,) = await client.wait_terminal({job.job_id}, timeout=120)
    assert done.phase == SUCCEEDED


def _lines_since(service, mark: int) -> list[str]:
    return service.log_path.read_bytes()[mark:].decode(errors="replace").splitlines()


async def test_a_lost_broker_is_one_warning_and_its_return_one_line(own_broker, own_topics, tmp_path):
    conn = own_broker.connection
    cluster = LocalCluster(conn, own_topics, tmp_path, partitions=PARTITIONS)
    try:
        admission = await cluster.admission("admission", 0, "--log-level", "INFO")
        placer = await cluster.placer("placer", "--log-level", "INFO")
        await cluster.agent("node-0", "2xA100-80GB", "--log-level", "INFO")
        client = Client(f"127.0.0.1:{admission.port}")
        await _run_a_job(client, "before")
        watched = [admission, placer]
        marks = {s.name: s.log_path.stat().st_size for s in watched}

        await own_broker.stop_async()
        for service in watched:
            await eventually_async(   # the services' logs are files: read until the line is there
                lambda: any("broker unreachable at" in line for line in _lines_since(service, marks[service.name])),
                f"{service.name}'s warning", 60, poll=0.2)
        await asyncio.sleep(DOWN_S)   # the broker stays away a while: what is logged meanwhile is the point
        for service in watched:
            lines = _lines_since(service, marks[service.name])
            lost = [i for i, line in enumerate(lines) if "broker unreachable at" in line]
            assert len(lost) == 1 and "WARNING" in lines[lost[0]] and "retrying" in lines[lost[0]], lines
            away = lines[lost[0] + 1:]   # what was logged while the broker was away
            assert [line for line in away if "ERROR" in line or "Traceback" in line or
                    ("WARNING" in line and " aiokafka" in line)] == [], away   # no client reconnect errors
            assert len(away) <= 3, away

        await own_broker.start_async()
        for service in watched:
            await eventually_async(
                lambda: any("reachable again" in line for line in _lines_since(service, marks[service.name])),
                f"{service.name}'s line that the broker is back", 90, poll=0.2)
            (back,) = [line for line in _lines_since(service, marks[service.name]) if "reachable again" in line]
            assert "INFO" in back and " after " in back, back
        await _run_a_job(client, "after")   # recovered: admission appends, the placer places, the agent runs
        await client.close()
    finally:
        await cluster.stop_all()
        if not own_broker.running:
            await own_broker.start_async()
