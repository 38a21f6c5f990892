"""A node host's beats records, joined from each node's beat encoded once, read back as
the ``HostBeats`` messages built field by field would be."""
from __future__ import annotations

import argparse

from gpusched.config import NodeHostSettings
from gpusched.v1 import events_pb2
from gpusched_node_agent.host import BEATS_PER_RECORD, NodeHost
from gpusched_node_agent.host_main import hosted_infos


def node_host(nodes: int) -> NodeHost:
    parser = argparse.ArgumentParser()
    NodeHostSettings.add_args(parser)
    own = NodeHostSettings.from_args(parser.parse_args(["--nodes", str(nodes), "--simulate", "8xH100-80GB"]))
    return NodeHost("h1", hosted_infos(own, "h1"), None, "node-host-h1", report_topic="r", beats_topic="b")


def built(host: NodeHost, now: float) -> list[events_pb2.HostBeats]:
    beats = [events_pb2.Heartbeat(node=n.name, pool=n.info.pool, agent_id=n.info.agent_id, time=now)
             for n in host.nodes.values()]
    return [events_pb2.HostBeats(host=host.name, time=now, beats=beats[i:i + BEATS_PER_RECORD])
            for i in range(0, len(beats), BEATS_PER_RECORD)]


def test_beats_records_read_as_the_messages_built_field_by_field():
    host = node_host(BEATS_PER_RECORD + 3)   # two records, the second of three beats
    for now in (1_700_000_000.25, 1_700_000_001.5):
        records = [events_pb2.HostBeats.FromString(r) for r in host.beat_records(now)]
        assert records == built(host, now)
        assert [len(r.beats) for r in records] == [BEATS_PER_RECORD, 3]
        assert {b.time for r in records for b in r.beats} == {now}
