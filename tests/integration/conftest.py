"""Fixtures shared by the integration tests.

* ``api`` (function): a one-node cluster (admission, placer and one 8-GPU node-agent) and
  a client of its admission, as ``(cluster, client)``; stopped afterwards."""
from __future__ import annotations

import pytest

from gpusched.client import Client
from gpusched.local_cluster import LocalCluster


@pytest.fixture
async def api(kafka_bootstrap, topics, tmp_path):
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path)
    admission = await cluster.admission()
    await cluster.placer()
    await cluster.agent("node-0", "8xA100-80GB")
    client = Client(f"127.0.0.1:{admission.port}")
    yield cluster, client
    await client.close()
    await cluster.stop_all()
