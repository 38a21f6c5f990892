"""A replica's load as its node-agent reads it (``replica_load``): the in-flight gauge and
the answered counter from a Prometheus page, gpusched's names or vLLM's (labelled series
summed), unmeasured when absent or when the replica does not answer 200; read from a
real model server over HTTP."""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

from gpusched.adapters.nodes.usage_records import UNMEASURED
from gpusched.ports import free_port
from gpusched_node_agent.readiness import http_check
from gpusched_node_agent.replica_load import parse_load, read_load

MODEL_SERVER = Path(__file__).resolve().parents[2] / "workloads" / "model_server.py"


def test_parse_reads_both_names_and_sums_labelled_series():
    assert parse_load("# HELP x\ngpusched_requests_in_flight 3\ngpusched_requests_total 120\n") == (3.0, 120.0)
    vllm = ('vllm:num_requests_running{model_name="a"} 2.0\nvllm:num_requests_running{model_name="b"} 1.0\n'
            'vllm:request_success_total{finished_reason="stop"} 10\nvllm:request_success_total{x="y"} 5\n')
    assert parse_load(vllm) == (3.0, 15.0)
    assert parse_load("other_metric 1\n") == (UNMEASURED, UNMEASURED)
    assert parse_load("gpusched_requests_in_flight NaN\ngpusched_requests_in_flight -1\n") == (UNMEASURED, UNMEASURED)


async def test_read_from_a_running_model_server_and_nothing_from_a_closed_port():
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(MODEL_SERVER)], env={**os.environ, "PORT": str(port)})
    try:
        for _ in range(200):
            if (await http_check(port, "/healthz", 1.0))[0]:
                break
            await asyncio.sleep(0.05)
        slow = asyncio.create_task(asyncio.to_thread(
            lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/work?ms=600").read()))
        for _ in range(100):   # until the slow request is in flight
            in_flight, answered = await read_load(port)
            if in_flight == 1.0:
                break
            await asyncio.sleep(0.02)
        assert (in_flight, answered) == (1.0, 0.0)
        await slow
        assert await read_load(port) == (0.0, 1.0)
    finally:
        proc.terminate()
        proc.wait(10)
    assert await read_load(port, timeout=0.5) == (UNMEASURED, UNMEASURED)
