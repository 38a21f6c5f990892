"""The metrics' values, read through an in-memory reader: gauges from a folded state,
counters from outcomes. tests/integration/test_observability.py reads them from a real
Prometheus scraping the services."""
from __future__ import annotations

import pytest
from opentelemetry import metrics as otel_metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from gpusched.adapters.telemetry import metrics
from gpusched.core import events as ev
from gpusched.core.reducer import Outcome
from tests.unit.core.builders import Log, make_node, whole


class Follower:
    def __init__(self, states, lags) -> None:
        self.states, self._lags = states, lags

    def lag(self, partition: int) -> int | None:
        return self._lags[partition]


@pytest.fixture(scope="module")
def reader():
    found = InMemoryMetricReader()
    otel_metrics.set_meter_provider(MeterProvider(metric_readers=[found]))
    return found


def points(reader, name: str) -> dict[tuple, float]:
    data = reader.get_metrics_data()
    return {tuple(sorted(p.attributes.items())): getattr(p, "value", getattr(p, "count", None))
            for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics if m.name == name
            for p in m.data.data_points}


def test_gauges_are_computed_from_the_followed_states(reader):
    log = Log(make_node("n1", gpus=8))
    assert log.submit("a", team="nlp", gpus=6).accepted
    assert log.place("a", ("n1", whole(0, 1, 2, 3, 4, 5))).accepted
    assert log.submit("b", team="vision", gpus=4).accepted
    assert log.submit("c", team="vision", workers=2, gpus=1).accepted
    metrics.watch_states(Follower({0: log.state}, {0: 7}))
    assert points(reader, "gpusched.jobs.pending") == {(("pool", "default"), ("team", "vision")): 2}
    assert points(reader, "gpusched.gpus.requested") == {(("pool", "default"), ("team", "vision")): 6}
    assert points(reader, "gpusched.gpus.allocated") == {(("pool", "default"), ("state", "allocated")): 6,
                                                         (("pool", "default"), ("state", "total")): 8}
    assert points(reader, "gpusched.consumer.lag") == {(("partition", "0"),): 7}


def test_outcomes_cycles_and_rpcs_are_counted_by_their_labels(reader):
    log = Log(make_node("n1", gpus=2))
    preempted = ev.JobPreempted(event_id="x", job_id="a", attempt=0, reason="priority")
    metrics.count_outcome(preempted, Outcome(True), log.state)
    metrics.count_outcome(preempted, Outcome(False, "unknown job"), log.state)
    fault = ev.GpuHealthChanged(event_id="y", node="n1", gpu_index=1, healthy=False, reason="xid 79")
    metrics.count_outcome(fault, Outcome(True), log.state)
    metrics.cycle_done(0, 0.002, [(preempted, "default"), (preempted, "default"), (preempted, "other")])
    metrics.rpc_done("/gpusched.v1.AdmissionService/SubmitJob", 0.01, "INVALID_ARGUMENT")
    assert points(reader, "gpusched.preemptions") == {(("cause", "priority"),): 1}
    assert points(reader, "gpusched.events.rejected") == {(("event", "JobPreempted"), ("reason", "unknown job")): 1}
    assert points(reader, "gpusched.gpu.faults") == {(("pool", "default"),): 1}
    assert points(reader, "gpusched.placer.decisions") == {(("pool", "default"),): 2, (("pool", "other"),): 1}
    assert points(reader, "gpusched.placer.cycle.duration") == {(("partition", "0"),): 1}
    assert points(reader, "gpusched.rpc.server.errors") == {
        (("code", "INVALID_ARGUMENT"), ("method", "/gpusched.v1.AdmissionService/SubmitJob")): 1}


def test_the_cycle_histogram_tells_a_slow_cycle_from_a_very_slow_one(reader):
    """Around the 100 ms target the buckets are fine: 90 ms, 150 ms and 900 ms cycles land in
    three different buckets, under, just over and far over."""
    for seconds in (0.09, 0.15, 0.9):
        metrics.cycle_done(7, seconds, [])
    point = next(p for rm in reader.get_metrics_data().resource_metrics for sm in rm.scope_metrics
                 for m in sm.metrics if m.name == "gpusched.placer.cycle.duration"
                 for p in m.data.data_points if p.attributes == {"partition": "7"})
    filled = [bound for bound, count in zip([*point.explicit_bounds, float("inf")], point.bucket_counts) if count]
    assert filled == [0.1, 0.15, 1]


def test_a_scrape_computes_the_gauges_on_the_loop_that_folds_the_states():
    """Prometheus scrapes from its server's thread while the fold mutates the states on the
    event loop: the gauge is computed on the loop's thread, between two events."""
    import asyncio
    import threading

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        seen: list[int] = []
        got = metrics.on_loop(loop, lambda: seen.append(threading.get_ident()) or [1])
        assert got == [1] and seen == [thread.ident]
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()


def test_a_scrape_skips_the_gauges_when_the_loop_is_busy(monkeypatch):
    import asyncio
    import threading
    import time

    monkeypatch.setattr(metrics, "SCRAPE_WAIT_S", 0.05)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    release = threading.Event()
    try:
        loop.call_soon_threadsafe(release.wait, 5)   # a long cycle holds the loop
        began = time.monotonic()
        assert metrics.on_loop(loop, lambda: [1]) == []
        assert time.monotonic() - began < 2
    finally:
        release.set()
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()


def test_a_placement_records_the_jobs_wait_in_the_queue_by_team_and_pool(reader):
    log = Log(make_node("n1", gpus=2))
    assert log.submit("w", team="search", gpus=1).accepted          # pending since t=2
    log.now += 37.0
    placed = log.place("w", ("n1", whole(0)))                       # placed at t=40
    metrics.count_outcome(log.events[-1], placed, log.state)
    point = next(p for rm in reader.get_metrics_data().resource_metrics for sm in rm.scope_metrics
                 for m in sm.metrics if m.name == "gpusched.queue.wait"
                 for p in m.data.data_points if p.attributes == {"team": "search", "pool": "default"})
    assert (point.count, point.sum) == (1, 38.0)


def test_a_nodes_usage_sample_is_the_gpus_its_workers_keep_busy(reader):
    metrics.usage_sampled("default", "n1", 3.5)
    metrics.usage_sampled("default", "n1", 2.25)   # the latest sample counts
    metrics.usage_sampled("a100", "n2", 1.0)
    assert points(reader, "gpusched.gpus.used") == {(("node", "n1"), ("pool", "default")): 2.25,
                                                    (("node", "n2"), ("pool", "a100")): 1.0}
