"""The heartbeat monitor takes a beat's node from its topic (the broker authenticated the
writer), never from the beat (gpusched.adapters.nodes.heartbeats). Pure: records are built here,
no broker."""
from __future__ import annotations

import re
from types import SimpleNamespace

from gpusched.adapters.nodes.heartbeats import HeartbeatMonitor, beats_pattern
from gpusched.adapters.broker.kafka_admin import TopicNames
from gpusched.v1 import events_pb2

TOPICS = TopicNames("x.")


def _record(topic: str, node: str) -> SimpleNamespace:
    return SimpleNamespace(topic=topic, partition=0, offset=0,
                           value=events_pb2.Heartbeat(node=node, time=1.0).SerializeToString())


async def _monitor() -> HeartbeatMonitor:
    async def send(value: bytes, key: bytes) -> None:
        raise AssertionError("not started: no probes")
    return HeartbeatMonitor("127.0.0.1:1", TOPICS, send)


async def test_a_beat_counts_for_the_node_of_its_topic_only():
    monitor = await _monitor()
    monitor._note(_record("x.beats.n1", "n1"))
    assert set(monitor.last_seen) == {"n1"}
    monitor._note(_record("x.beats.n1", "n2"))   # n1's login beating in n2's name
    monitor._note(_record("x.heartbeats", "n2"))  # the shared topic carries probes only
    assert set(monitor.last_seen) == {"n1"} and monitor.refused == 1


async def test_the_probe_comes_back_on_the_shared_topic():
    monitor = await _monitor()
    assert monitor.last_probe == 0.0
    monitor._note(_record("x.heartbeats", monitor._probe_name))
    assert monitor.last_probe > 0.0 and not monitor.last_seen


def test_the_pattern_is_the_beats_topics_and_the_probes_of_this_prefix():
    pattern = re.compile(beats_pattern(TOPICS))
    assert pattern.match("x.beats.n1") and pattern.match("x.heartbeats")
    for other in ("x.reports.n1", "xy.beats.n1", "x.usage", "y.heartbeats", "x.beats."):
        assert not pattern.match(other), other


def _host_record(host: str, *nodes: str) -> SimpleNamespace:
    beats = events_pb2.HostBeats(host=host, time=1.0, beats=[events_pb2.Heartbeat(node=n, time=1.0) for n in nodes])
    return SimpleNamespace(topic=f"x.hostbeats.{host}", partition=0, offset=0, value=beats.SerializeToString())


async def test_one_host_record_is_heard_as_each_of_its_nodes_and_no_other():
    monitor = await _monitor()
    monitor._note(_host_record("h1", "h1-00000", "h1-00001"))
    assert set(monitor.last_seen) == {"h1-00000", "h1-00001"}
    # a host may not keep alive a real node nor another host's node
    monitor._note(_host_record("h1", "n1", "h2-00000", "h1", "h1-"))
    assert set(monitor.last_seen) == {"h1-00000", "h1-00001"} and monitor.refused == 4


def test_the_pattern_covers_the_node_hosts_beats():
    pattern = re.compile(beats_pattern(TOPICS))
    assert pattern.match("x.hostbeats.h1")
    assert not pattern.match("y.hostbeats.h1") and not pattern.match("x.hostreports.h1")
