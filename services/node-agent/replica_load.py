"""A service replica's load, read by its node-agent for the autoscaler
(``policies.autoscaling``; docs/guide/inference.md, "Autoscaling").

Worker 0 of a replica that serves a port is asked ``GET /metrics`` on it (Prometheus'
text format) at each usage sample; the agent puts what it read in the worker's usage
record. Read: the requests in flight (a gauge) and the requests answered (a counter), by
their names here: gpusched's own, or vLLM's. A replica that answers no such series is
left unmeasured; one that does not answer at all is asked again at the next sample.
"""
from __future__ import annotations

import asyncio
import math

from gpusched.adapters.nodes.usage_records import UNMEASURED

IN_FLIGHT = ("gpusched_requests_in_flight", "vllm:num_requests_running")
ANSWERED = ("gpusched_requests_total", "vllm:request_success_total")
MAX_BYTES = 1 << 20   # a metrics page larger than this is not read further


def parse_load(text: str) -> tuple[float, float]:
    """(requests in flight, requests answered) in a Prometheus text page; -1 for a series
    it does not have. Series with labels are summed (vLLM labels by model)."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_part, _, rest = line.partition(" ")
        name = name_part.split("{", 1)[0]
        if name not in IN_FLIGHT and name not in ANSWERED:
            continue
        try:
            value = float(rest.split()[0])
        except (IndexError, ValueError):
            continue
        if math.isfinite(value) and value >= 0:
            key = "in_flight" if name in IN_FLIGHT else "answered"
            found[key] = found.get(key, 0.0) + value
    return found.get("in_flight", UNMEASURED), found.get("answered", UNMEASURED)


async def read_load(port: int, timeout: float = 1.0, path: str = "/metrics") -> tuple[float, float]:
    """``parse_load`` of the replica's metrics page; (-1, -1) when it does not answer 200."""
    async def get() -> str:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(f"GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n".encode())
            await writer.drain()
            data = await reader.read(MAX_BYTES)
            while len(data) < MAX_BYTES and (more := await reader.read(MAX_BYTES - len(data))):
                data += more
        finally:
            writer.close()
        head, _, body = data.partition(b"\r\n\r\n")
        status = head.split(b"\r\n", 1)[0].split()
        return body.decode("utf-8", "replace") if len(status) > 1 and status[1] == b"200" else ""
    try:
        return parse_load(await asyncio.wait_for(get(), timeout))
    except (asyncio.TimeoutError, OSError):
        return UNMEASURED, UNMEASURED
