"""OpenTelemetry metrics with a Prometheus ``/metrics`` endpoint on every service.

Off unless ``GPUSCHED_METRICS_PORT`` is set: then ``setup_metrics`` installs a meter
provider whose Prometheus reader serves the port. Instruments are made once here, on the
API's proxy meter (no-ops while metrics are off). What the state already knows (pending
jobs, GPUs requested and allocated, lag) is computed from the followed states when
Prometheus scrapes, by observable callbacks, never per event; counters are added where
the thing happens (a cycle, an RPC, an outcome admission folds). docs/reference/observability.md
lists every metric with its labels.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections import Counter
from typing import Callable, Iterable

from opentelemetry import metrics
from opentelemetry.metrics import Observation

from gpusched.config import process_settings
from gpusched.core import events as ev

log = logging.getLogger(__name__)
METER = metrics.get_meter("gpusched")
SCRAPE_WAIT_S = 5.0   # a scrape waits this long for the event loop (busy in a long cycle), then skips the gauges

# Fine around the 100 ms a cycle should stay under, so that a p99 of 150 ms and one of 900 ms
# fall in different buckets.
CYCLE_BUCKETS_S = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.125, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5,
                   0.75, 1, 1.5, 2.5, 5]
CYCLE_SECONDS = METER.create_histogram(
    "gpusched.placer.cycle.duration", unit="s", description="one scheduling cycle of a partition",
    explicit_bucket_boundaries_advisory=CYCLE_BUCKETS_S)
DECISIONS = METER.create_counter("gpusched.placer.decisions", description="jobs placed, per pool")
REJECTIONS = METER.create_counter("gpusched.events.rejected",
                                  description="events the reducer rejected, per reason (folded by admission)")
PREEMPTIONS = METER.create_counter("gpusched.preemptions", description="jobs preempted, per cause "
                                   "(folded by admission)")
GPU_FAULTS = METER.create_counter("gpusched.gpu.faults", description="GPUs reported unhealthy, per pool "
                                  "(folded by admission)")
RPC_SECONDS = METER.create_histogram(
    "gpusched.rpc.server.duration", unit="s", description="gRPC calls served, per method and status code",
    explicit_bucket_boundaries_advisory=[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5])
RPC_ERRORS = METER.create_counter("gpusched.rpc.server.errors",
                                  description="gRPC calls answered with a status other than OK")
# From a second to a day: how long jobs wait to be placed, the fair-share queue's figure per team.
QUEUE_WAIT = METER.create_histogram(
    "gpusched.queue.wait", unit="s", description="time from entering the queue to being placed, per team and pool "
    "(folded by admission)", explicit_bucket_boundaries_advisory=[1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200,
                                                                  14400, 43200, 86400])
_gpus_used: dict[tuple[str, str], float] = {}   # (pool, node) -> GPUs busy in its latest usage sample


def _used() -> Iterable[Observation]:
    return [Observation(v, {"pool": pool, "node": node}) for (pool, node), v in _gpus_used.items()]


METER.create_observable_gauge("gpusched.gpus.used", [lambda options: _used()],
                              description="GPUs kept busy by their workers in a node's latest usage sample "
                                          "(SM fraction x the workers' parts of their GPUs), per pool and node")


def setup_metrics(service: str, follower=None) -> int:
    """Serve ``/metrics`` on the configured port, with the gauges over ``follower``'s
    states; the port, or 0 when metrics are off."""
    settings = process_settings()
    if not settings.metrics_port:
        return 0
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.resources import Resource
    from prometheus_client import start_http_server

    start_http_server(settings.metrics_port, addr=settings.metrics_host)
    reader = PrometheusMetricReader()
    metrics.set_meter_provider(MeterProvider(resource=Resource.create({"service.name": service}),
                                             metric_readers=[reader]))
    if follower is not None:
        watch_states(follower)
    log.info("metrics on http://%s:%d/metrics", settings.metrics_host, settings.metrics_port)
    return settings.metrics_port


def watch_states(follower, loop: asyncio.AbstractEventLoop | None = None) -> None:
    """Gauges over the partitions a ``LogFollower`` holds, computed on each scrape. The
    states are folded on ``loop`` (by default the running one) while Prometheus scrapes
    from its server's thread, so each gauge is computed on the loop, between two events,
    never while the fold changes a state (walking a dict it resizes would fail)."""
    if loop is None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None    # no loop (a test, a tool): nothing folds concurrently
    gauges = {"gpusched.jobs.pending": (lambda: _pending(follower, jobs=True), "jobs waiting, per team and pool"),
              "gpusched.gpus.requested": (lambda: _pending(follower, jobs=False),
                                          "GPUs requested by waiting jobs, per team and pool"),
              "gpusched.gpus.allocated": (lambda: _allocated(follower),
                                          "GPUs allocated and GPUs in total, per pool (state=allocated|total)"),
              "gpusched.consumer.lag": (lambda: _lag(follower),
                                        "records of the pool log not yet folded, per partition")}
    for name, (compute, description) in gauges.items():
        METER.create_observable_gauge(name, [lambda o, compute=compute: on_loop(loop, compute)],
                                      description=description)


def on_loop(loop: asyncio.AbstractEventLoop | None, compute: Callable[[], list]) -> list:
    """``compute()`` run on ``loop``'s thread; [] when the loop does not answer within
    ``SCRAPE_WAIT_S`` (this scrape goes without the gauge) or has stopped."""
    if loop is None or loop.is_closed() or not loop.is_running():
        return compute()
    try:
        if asyncio.get_running_loop() is loop:
            return compute()
    except RuntimeError:
        pass   # a thread without a loop: Prometheus's server

    # A plain callback, not a coroutine: a scrape given up on is cancelled before it runs,
    # and nothing is left unawaited on a loop that stops meanwhile.
    future: concurrent.futures.Future = concurrent.futures.Future()

    def run() -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(compute())
        except BaseException as exc:   # the scrape's thread raises it
            future.set_exception(exc)

    loop.call_soon_threadsafe(run)
    try:
        return future.result(SCRAPE_WAIT_S)
    except concurrent.futures.TimeoutError:
        future.cancel()
        log.warning("metrics: the event loop did not answer within %gs; gauges skipped", SCRAPE_WAIT_S)
        return []


def _pending(follower, jobs: bool) -> Iterable[Observation]:
    counts: Counter = Counter()
    for state in follower.states.values():
        for job_id in state.pending:
            spec = state.jobs[job_id].spec
            counts[spec.team, spec.pool] += 1 if jobs else spec.total_milli / 1000
    return [Observation(v, {"team": team, "pool": pool}) for (team, pool), v in counts.items()]


def _allocated(follower) -> Iterable[Observation]:
    used: Counter = Counter()
    total: Counter = Counter()
    for state in follower.states.values():
        for node in state.nodes.values():
            total[node.info.pool] += len(node.gpus)
            used[node.info.pool] += sum(g.used_milli for g in node.gpus) / 1000
    return [*(Observation(v, {"pool": p, "state": "allocated"}) for p, v in used.items()),
            *(Observation(v, {"pool": p, "state": "total"}) for p, v in total.items())]


def _lag(follower) -> Iterable[Observation]:
    found = ((p, follower.lag(p)) for p in follower.states)
    return [Observation(lag, {"partition": str(p)}) for p, lag in found if lag is not None]


def cycle_done(partition: int, seconds: float, placed: list[tuple[ev.Event, str]]) -> None:
    CYCLE_SECONDS.record(seconds, {"partition": str(partition)})
    for pool, n in Counter(pool for _, pool in placed).items():
        DECISIONS.add(n, {"pool": pool})


def count_outcome(event: ev.Event, result, state) -> None:
    """Count what a folded event means for the cluster (called by one service, admission)."""
    if not result.accepted:
        REJECTIONS.add(1, {"event": type(event).__name__, "reason": result.reason})
    elif type(event) is ev.JobPlaced:
        job = state.jobs.get(event.job_id)
        if job is not None and job.placed_at >= job.pending_since > 0:
            QUEUE_WAIT.record(job.placed_at - job.pending_since, {"team": job.spec.team, "pool": job.spec.pool})
    elif type(event) is ev.JobPreempted:
        PREEMPTIONS.add(1, {"cause": event.reason or "unspecified"})
    elif type(event) is ev.GpuHealthChanged and not event.healthy:
        node = state.nodes.get(event.node)
        GPU_FAULTS.add(1, {"pool": node.info.pool if node is not None else ""})


def usage_sampled(pool: str, node: str, gpus_busy: float) -> None:
    """A node's latest usage sample (the node-agent's): GPUs its workers kept busy."""
    global _gpus_used
    _gpus_used = {**_gpus_used, (pool, node): gpus_busy}   # replaced whole: the scrape's thread reads it


def rpc_done(method: str, seconds: float, code: str) -> None:
    RPC_SECONDS.record(seconds, {"method": method, "code": code})
    if code != "OK":
        RPC_ERRORS.add(1, {"method": method, "code": code})
