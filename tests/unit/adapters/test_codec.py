"""The wire codec: every domain event round-trips through the protobuf EventEnvelope,
and anything that is not a valid event raises codec.DecodeError, never another exception
but NewerLogSchema for a record of a newer log schema (tests/unit/adapters/test_log_schema.py)."""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gpusched.adapters import codec
from gpusched.adapters.log_schema import NewerLogSchema
from gpusched.core import events as ev
from gpusched.core.model import (
    GpuInfo, GpuSlot, JobKind, JobSpec, NodeCount, NodeInfo, PendingKind, PendingReason, WorkerAssignment,
    WorkerResources,
)
from gpusched.core.policy import Quota, TeamPolicy
from gpusched.v1 import events_pb2, types_pb2
from gpusched.version import LOG_SCHEMA

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# --- strategies matching the proto field types ----------------------------------------
text = st.text(max_size=12)                                 # no surrogates: valid UTF-8
ids = st.text(min_size=1, max_size=12)
i32 = st.integers(-(2 ** 31), 2 ** 31 - 1)
i64 = st.integers(-(2 ** 63), 2 ** 63 - 1)
f64 = st.floats(allow_nan=False)                            # NaN != NaN; everything else is exact
words = st.lists(text, max_size=3).map(tuple)

gpu_infos = st.builds(GpuInfo, index=i32, uuid=text, model=text, memory_mib=i64, mig_capable=st.booleans())
node_infos = st.builds(
    NodeInfo, name=text, pool=text, cpu_milli=i64, memory_mib=i64,
    gpus=st.lists(gpu_infos, max_size=3).map(tuple),
    # a proto map has no order and one value per key: the canonical form is sorted pairs
    labels=st.dictionaries(text, text, max_size=3).map(lambda d: tuple(sorted(d.items()))),
    simulated=st.booleans(), agent_id=text, address=text, lease_s=f64, kill_wait_s=f64,
)
resources = st.builds(
    WorkerResources, gpus=i32, gpu_milli=i32, mig_profile=text, cpu_milli=i64, memory_mib=i64,
    gpu_models=words,
)
job_specs = st.builds(
    JobSpec, name=text, team=text, pool=text, priority_class=text, kind=st.sampled_from(JobKind),
    workers=i32, resources=resources, max_runtime_s=f64, preemptible=st.booleans(),
    checkpoint_interval_s=f64, command=words, simulated_duration_s=f64, org=text, max_restarts=i32,
)
slots = st.builds(GpuSlot, index=i32, milli=i32, mig_profile=text, mig_start=i32)
assignments = st.builds(WorkerAssignment, worker=i32, node=text, gpus=st.lists(slots, max_size=3).map(tuple))

quotas = st.builds(Quota, org=text, team=text, guaranteed_milli=i64, limit_milli=i64, borrowing=st.booleans(),
                   lending_limit_milli=i64, weight=f64)
team_policies = st.builds(TeamPolicy, team=text, weight=f64, priority_classes=words, pools=words)
pending_reasons = st.builds(PendingReason, kind=st.sampled_from(PendingKind), summary=text, nodes=i32,
                            counts=st.lists(st.builds(NodeCount, filter=text, nodes=i32), max_size=3).map(tuple))


GENERATED: dict[type, set[str]] = {}   # fields each strategy below fills in


def _event(cls, **fields):
    GENERATED[cls] = {"event_id", "time", "producer", *fields}
    return st.builds(cls, event_id=ids, time=f64, producer=text, **fields)


EVENTS = {
    ev.NodeRegistered: _event(ev.NodeRegistered, node=node_infos),
    ev.NodeLost: _event(ev.NodeLost, node=text, reason=text),
    ev.NodeCordoned: _event(ev.NodeCordoned, node=text, reason=text, principal=text),
    ev.NodeUncordoned: _event(ev.NodeUncordoned, node=text, principal=text),
    ev.GpuHealthChanged: _event(ev.GpuHealthChanged, node=text, gpu_index=i32, healthy=st.booleans(),
                                reason=text, xid=i32),
    ev.JobSubmitted: _event(ev.JobSubmitted, job_id=text, spec=job_specs, idempotency_key=text, principal=text),
    ev.JobCancelled: _event(ev.JobCancelled, job_id=text, reason=text, principal=text),
    ev.JobPlaced: _event(ev.JobPlaced, job_id=text, attempt=i32,
                         workers=st.lists(assignments, max_size=3).map(tuple), policy=text),
    ev.WorkerStarted: _event(ev.WorkerStarted, job_id=text, attempt=i32, worker=i32, node=text),
    ev.WorkerFinished: _event(ev.WorkerFinished, job_id=text, attempt=i32, worker=i32, node=text,
                              exit_code=i32, reason=text, signal=i32),
    ev.CheckpointSaved: _event(ev.CheckpointSaved, job_id=text, attempt=i32, checkpoint=text, progress_s=f64),
    ev.JobPreempted: _event(ev.JobPreempted, job_id=text, attempt=i32, for_job=text, reason=text,
                            planned_nodes=words),
    ev.AttemptFailed: _event(ev.AttemptFailed, job_id=text, attempt=i32, reason=text, charge=st.booleans()),
    ev.JobRetentionSet: _event(ev.JobRetentionSet, job_retention_s=f64),
    ev.NodeFenced: _event(ev.NodeFenced, node=text),
    ev.RendezvousSet: _event(ev.RendezvousSet, job_id=text, attempt=i32, node=text, address=text, port=i32),
    ev.AttemptTimedOut: _event(ev.AttemptTimedOut, job_id=text, attempt=i32, reason=text),
    ev.PoolTimeLimitsSet: _event(ev.PoolTimeLimitsSet, pool=text, default_s=f64, max_s=f64, principal=text),
    ev.QuotaSet: _event(ev.QuotaSet, quota=quotas, principal=text),
    ev.TeamPolicySet: _event(ev.TeamPolicySet, policy=team_policies, principal=text),
    ev.PoolCreated: _event(ev.PoolCreated, pool=text, principal=text),
    ev.JobPendingReason: _event(ev.JobPendingReason, job_id=text, attempt=i32, reason=pending_reasons),
}
any_event = st.one_of(*EVENTS.values())


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


# --- bad input: DecodeError and nothing else -------------------------------------------
def _env(**kw) -> bytes:
    return events_pb2.EventEnvelope(**kw).SerializeToString()


def _submitted(kind: int) -> bytes:
    env = events_pb2.EventEnvelope(event_id="e1", type="JobSubmitted")
    env.job_submitted.job_id = "j"
    env.job_submitted.spec.kind = kind
    return env.SerializeToString()


BAD = [
    ("empty", b""),
    ("garbage", b"\xff\xff\xff\xff"),
    ("truncated-varint", b"\x08"),
    ("truncated-length", b"\x0a\x05ab"),
    ("invalid-utf8-event-id", b"\x0a\x02\xff\xfe"),
    ("wrong-wire-type", b"\x0d\x00\x00\x00\x00"),           # event_id as fixed32
    ("no-type", _env(event_id="e1", job_cancelled=events_pb2.JobCancelled(job_id="j"))),
    ("unknown-type", _env(event_id="e1", type="JobExploded", job_cancelled=events_pb2.JobCancelled(job_id="j"))),
    ("base-class-type", _env(event_id="e1", type="Event", job_cancelled=events_pb2.JobCancelled(job_id="j"))),
    ("lowercase-type", _env(event_id="e1", type="jobcancelled", job_cancelled=events_pb2.JobCancelled(job_id="j"))),
    ("type-payload-mismatch", _env(event_id="e1", type="JobCancelled", job_placed=events_pb2.JobPlaced(job_id="j"))),
    ("type-without-payload", _env(event_id="e1", type="NodeLost")),
    ("missing-event-id", _env(type="NodeLost", node_lost=events_pb2.NodeLost(node="n1"))),
    ("unspecified-enum", _submitted(types_pb2.JOB_KIND_UNSPECIFIED)),
    ("unknown-enum-number", _submitted(99)),
    ("negative-enum-number", _submitted(-1)),
    ("another-message", events_pb2.Heartbeat(node="n1", pool="p", agent_id="a", time=1.0).SerializeToString()),
    ("deep-unknown-groups", b"\x9b\x06" * 2000 + b"\x9c\x06" * 2000),
]


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
