"""The wire codec: every domain event round-trips through the protobuf EventEnvelope,
and anything that is not a valid event raises codec.DecodeError, never another exception
but NewerLogSchema for a record of a newer log schema (tests/unit/adapters/test_log_schema.py)."""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gpusched.adapters.log import codec
from gpusched.adapters.log.log_schema import NewerLogSchema
from gpusched.core import events as ev
from gpusched.core.model import GpuSlot, JobSpec, WorkerAssignment
from gpusched.v1 import events_pb2, types_pb2
from gpusched.version import LOG_SCHEMA
from tests.unit.adapters.codec_cases import FAST, text, slots, GENERATED, EVENTS, any_event, BAD


def test_strategies_cover_every_event_type():
    assert set(EVENTS) == set(ev.EVENT_TYPES.values())


def test_strategies_cover_every_field():
    # a field added to an event without a strategy here would only ever be tested at its
    # default value; make that gap loud instead
    for cls in EVENTS:
        assert GENERATED[cls] == {f.name for f in dataclasses.fields(cls)}, cls.__name__


# --- round trips ------------------------------------------------------------------------
@pytest.mark.parametrize("cls", list(EVENTS), ids=lambda c: c.__name__)
@FAST
@given(data=st.data(), pool=text, trace=st.dictionaries(text, text, max_size=2))
def test_every_event_type_round_trips(cls, data, pool, trace):
    event = data.draw(EVENTS[cls])
    blob = codec.encode(event, pool, trace)
    decoded, env = codec.decode(blob)
    assert type(decoded) is cls
    assert decoded == event
    assert env.type == cls.__name__ and env.pool == pool and dict(env.trace_context) == trace
    assert env.event_id == event.event_id and env.time == event.time and env.producer == event.producer
    # re-encoding the decoded event gives the same bytes (no drift across hops)
    assert codec.encode(decoded, pool, trace) == blob
    # frozen all the way down, like the original: repeated fields come back as tuples
    assert hash(decoded) == hash(event)


@pytest.mark.parametrize("value", [0, 1, 3, 7])
def test_max_restarts_survives_including_zero(value):
    event = ev.JobSubmitted(event_id="e1", job_id="j", spec=JobSpec(name="j", team="t", max_restarts=value))
    decoded, _ = codec.decode(codec.encode(event, "default"))
    assert decoded.spec.max_restarts == value


def test_max_restarts_absent_means_the_default():
    env = events_pb2.EventEnvelope(event_id="e1", type="JobSubmitted")
    env.job_submitted.job_id = "j"
    env.job_submitted.spec.name = "j"
    env.job_submitted.spec.kind = types_pb2.JOB_KIND_TRAINING
    assert not env.job_submitted.spec.HasField("max_restarts")
    decoded, _ = codec.decode(env.SerializeToString())
    assert decoded.spec.max_restarts == JobSpec(name="", team="").max_restarts == 3
    # and an explicit zero is on the wire, so it is told apart from "unset"
    blob = codec.encode(dataclasses.replace(decoded, spec=dataclasses.replace(decoded.spec, max_restarts=0)), "p")
    env2 = events_pb2.EventEnvelope.FromString(blob)
    assert env2.job_submitted.spec.HasField("max_restarts") and env2.job_submitted.spec.max_restarts == 0


def test_planned_nodes_round_trip_and_are_empty_in_older_records():
    event = ev.JobPreempted(event_id="p1", job_id="v", attempt=2, for_job="b", reason="priority: x",
                            planned_nodes=("n0", "n1"))
    blob = codec.encode(event, "p")
    assert list(events_pb2.EventEnvelope.FromString(blob).job_preempted.planned_nodes) == ["n0", "n1"]
    assert codec.decode(blob)[0] == codec.decode_slow(blob)[0] == event
    # a record written before the field existed: fields 1-4 only
    env = events_pb2.EventEnvelope(event_id="p0", type="JobPreempted")
    env.job_preempted.job_id, env.job_preempted.attempt, env.job_preempted.for_job = "v", 0, "b"
    old, _ = codec.decode(env.SerializeToString())
    assert old.planned_nodes == () and old.for_job == "b"


@FAST
@given(event=any_event, extra=st.integers(100, 500), junk=st.binary(max_size=8))
def test_unknown_fields_from_newer_producers_are_ignored(event, extra, junk):
    blob = codec.encode(event, "p")
    tag = (extra << 3) | 2                              # an unknown length-delimited field
    varint = bytearray()
    while True:
        byte, tag = tag & 0x7F, tag >> 7
        varint.append(byte | (0x80 if tag else 0))
        if not tag:
            break
    decoded, _ = codec.decode(blob + bytes(varint) + bytes([len(junk)]) + junk)
    assert decoded == event


@pytest.mark.parametrize("blob", [b for _, b in BAD], ids=[n for n, _ in BAD])
def test_bad_records_raise_decode_error(blob):
    with pytest.raises(codec.DecodeError):
        codec.decode(blob)


def test_decode_error_is_a_value_error():
    # consumers that catch ValueError for bad input keep working
    assert issubclass(codec.DecodeError, ValueError)


def _decode_or_decode_error(blob: bytes) -> None:
    try:
        event, env = codec.decode(blob)
    except codec.DecodeError:
        return
    except NewerLogSchema as exc:   # the schema field came out above this code's (test_log_schema.py)
        assert exc.schema > LOG_SCHEMA
        return
    assert isinstance(event, ev.Event) and type(event).__name__ == env.type
    assert event.event_id


@settings(max_examples=300, deadline=None)
@given(blob=st.binary(max_size=64))
@example(blob=b"\x12\x0cJobSubmitted\x0a\x01e")
@example(blob=b"\x7a\x00")
def test_fuzz_random_bytes(blob):
    _decode_or_decode_error(blob)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(event=any_event, data=st.data())
def test_fuzz_mutated_valid_records(event, data):
    blob = bytearray(codec.encode(event, "p"))
    for _ in range(data.draw(st.integers(1, 4))):
        op = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        at = data.draw(st.integers(0, max(0, len(blob) - 1)))
        if op == "flip" and blob:
            blob[at] ^= data.draw(st.integers(1, 255))
        elif op == "cut":
            del blob[at:at + data.draw(st.integers(1, 8))]
        else:
            blob[at:at] = data.draw(st.binary(min_size=1, max_size=4))
    _decode_or_decode_error(bytes(blob))


# --- the fast decode path agrees with the generic one ------------------------------------
needs_slow = pytest.mark.skipif(not hasattr(codec, "decode_slow"), reason="no decode_slow reference")


def _outcome(fn, blob: bytes):
    try:
        event, env = fn(blob)
    except codec.DecodeError:
        return "DecodeError"
    except NewerLogSchema:
        return "NewerLogSchema"
    return event, env.SerializeToString()


@needs_slow
@FAST
@given(event=any_event, data=st.data())
def test_decode_matches_reference_decoder(event, data):
    blob = bytearray(codec.encode(event, "p"))
    if data.draw(st.booleans()) and blob:
        blob[data.draw(st.integers(0, len(blob) - 1))] ^= data.draw(st.integers(1, 255))
    fast, slow = _outcome(codec.decode, bytes(blob)), _outcome(codec.decode_slow, bytes(blob))
    # compared by repr too: a flipped bit can make a float NaN, and NaN != NaN
    assert fast == slow or (fast != "DecodeError" and slow != "DecodeError"
                            and (repr(fast[0]), fast[1]) == (repr(slow[0]), slow[1]))
    if fast not in ("DecodeError", "NewerLogSchema"):
        assert [type(getattr(fast[0], f.name)) for f in dataclasses.fields(fast[0])] == \
            [type(getattr(slow[0], f.name)) for f in dataclasses.fields(slow[0])]


@needs_slow
@pytest.mark.parametrize("blob", [b for _, b in BAD], ids=[n for n, _ in BAD])
def test_reference_decoder_rejects_bad_records_too(blob):
    with pytest.raises(codec.DecodeError):
        codec.decode_slow(blob)


# --- interned values ------------------------------------------------------------------------
def _placed(slots: tuple[GpuSlot, ...], n: int) -> bytes:
    return codec.encode(ev.JobPlaced(event_id=f"e{n}", time=1.0, producer="p", job_id=f"j{n}", attempt=0,
                                     workers=(WorkerAssignment(0, "node-1", slots),), policy="best-fit"), "p")


def test_equal_gpu_slots_decode_to_one_shared_object():
    a = codec.decode(_placed((GpuSlot(3), GpuSlot(4)), 1))[0]
    b = codec.decode(_placed((GpuSlot(3), GpuSlot(5, 500)), 2))[0]
    assert a.workers[0].gpus[0] is b.workers[0].gpus[0]
    assert a.workers[0].gpus[1] == GpuSlot(4) and b.workers[0].gpus[1] == GpuSlot(5, 500)
    assert a.workers[0].gpus[1] is not b.workers[0].gpus[1]


def test_the_intern_cache_stays_bounded_and_decoding_stays_right():
    limit = codec.INTERN_LIMIT
    for n in range(limit + 50):   # more distinct slots than the cache keeps
        slot = GpuSlot(n % 64, 1 + n // 64, "", 0)
        assert codec.decode(_placed((slot,), n))[0].workers[0].gpus == (slot,)
    build = codec._MSG_BUILDERS[GpuSlot]
    assert len(build.__globals__["_cache"]) <= limit
