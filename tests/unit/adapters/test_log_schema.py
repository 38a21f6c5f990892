"""The log schema on the wire: every envelope carries the writer's (gpusched.version),
a record written before the field existed reads as schema 1, and a record of a newer
schema is never folded nor skipped: decoding it raises ``NewerLogSchema``, a SystemExit
whose one line names the record, the schema, its writer and the upgrade; the relay
refuses such a report into the dead letters instead."""
from __future__ import annotations

import asyncio
from collections import namedtuple

import pytest

from gpusched.adapters.log import codec, flat
from gpusched.adapters.log.fold import fold_flat, fold_records
from gpusched.adapters.log.log_schema import NewerLogSchema
from gpusched.adapters.log.publisher import DeadLetters
from gpusched.adapters.nodes.relay import triage
from gpusched.core import events as ev
from gpusched.core.state import ClusterState
from gpusched.v1 import events_pb2
from gpusched.version import LOG_SCHEMA, VERSION
from tests.unit.core.builders import make_node

Record = namedtuple("Record", "topic partition offset key value headers")


def registered(event_id: str = "e1") -> ev.NodeRegistered:
    return ev.NodeRegistered(event_id=event_id, time=1.0, producer="node-agent-n1", node=make_node("n1", 2))


def written(event: ev.Event, schema: int | None) -> bytes:
    """``event`` encoded, its envelope's schema set to ``schema`` (None: left out, as
    records written before the field existed)."""
    env = events_pb2.EventEnvelope.FromString(codec.encode(event, "default"))
    if schema is None:
        env.ClearField("schema")
    else:
        env.schema = schema
    return env.SerializeToString()


def test_every_record_carries_the_writers_schema_and_one_without_it_reads_as_schema_one():
    assert events_pb2.EventEnvelope.FromString(codec.encode(registered(), "default")).schema == LOG_SCHEMA
    for schema in (None, LOG_SCHEMA):
        event, _ = codec.decode(written(registered(), schema))
        assert event == registered()
        assert flat.unflatten(codec.decode_flat(written(registered(), schema))) == registered()


@pytest.mark.parametrize("decode", [codec.decode, codec.decode_flat, codec.decode_slow])
def test_a_record_of_a_newer_schema_is_refused_by_every_decoder_in_one_line(decode):
    with pytest.raises(NewerLogSchema) as refused:
        decode(written(registered(), LOG_SCHEMA + 1))
    assert isinstance(refused.value, SystemExit) and not isinstance(refused.value, Exception)
    assert str(refused.value) == (f"a record of log schema {LOG_SCHEMA + 1} (written by node-agent-n1); this "
                                  f"gpusched {VERSION} reads log schemas up to {LOG_SCHEMA}: upgrade it "
                                  '(docs/guide/deploying.md, "Upgrades")')


def test_the_fold_stops_at_a_newer_record_naming_it_without_folding_or_skipping_it():
    state, letters = ClusterState(), DeadLetters(None, "test")
    records = [Record("p.cluster-events", 2, 0, b"default", written(registered("e1"), None), ()),
               Record("p.cluster-events", 2, 1, b"default", written(registered("e2"), LOG_SCHEMA + 1), ())]
    with pytest.raises(NewerLogSchema, match=rf"^p\.cluster-events\[2\]@1: a record of log schema {LOG_SCHEMA + 1} "):
        asyncio.run(fold_records("test", state, records, None, letters))
    assert state.offset == 0 and "n1" in state.nodes     # the first folded, the newer neither folded nor passed
    assert list(letters.skipped) == []


def test_a_catch_up_frame_stops_the_fold_the_same_way():
    state = ClusterState()
    items = [codec.decode_flat(written(registered("e1"), LOG_SCHEMA)), (flat.NEWER_SCHEMA, LOG_SCHEMA + 1, "placer-1")]
    with pytest.raises(NewerLogSchema, match=rf"^p\.cluster-events\[0\]@8: a record of log schema {LOG_SCHEMA + 1} \(written by "
                                             r"placer-1\)"):
        fold_flat("test", "p.cluster-events", 0, state, [7, 8], items, None, freeze=False)
    assert state.offset == 7


def test_the_relay_refuses_a_newer_report_into_the_dead_letters():
    verdict = triage("n1", written(registered(), LOG_SCHEMA + 1), {0: ClusterState()}, 1)
    assert verdict.event is None and verdict.reason.startswith(f"refused: a record of log schema {LOG_SCHEMA + 1}")
