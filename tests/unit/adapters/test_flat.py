"""The flat form events take between the catch-up reader and the follower: every event
comes back equal from its tuples, through pickle, with value objects and strings shared
as designed."""
from __future__ import annotations

import dataclasses
import pickle

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpusched.adapters.log import codec, flat
from gpusched.core import events as ev
from gpusched.core.model import GpuSlot, JobSpec, WorkerAssignment, WorkerResources
from gpusched.v1 import events_pb2, types_pb2
from tests.unit.adapters.codec_cases import BAD as CODEC_BAD, EVENTS, FAST, any_event


def test_every_event_type_has_a_code():
    assert set(flat.EVENT_CLASSES) == set(ev.EVENT_TYPES.values())
    assert len(flat.BUILD_BY_CODE) == len(flat.EVENT_CLASSES)


@pytest.mark.parametrize("cls", list(EVENTS), ids=lambda c: c.__name__)
@FAST
@given(data=st.data())
def test_every_event_type_round_trips_through_pickle(cls, data):
    event = data.draw(EVENTS[cls])
    flat.forget_strings()
    rebuilt = flat.unflatten(pickle.loads(pickle.dumps(flat.flatten(event), protocol=5)))
    assert type(rebuilt) is cls
    assert rebuilt == event
    assert hash(rebuilt) == hash(event)   # frozen all the way down: tuples, not lists


@FAST
@given(events=st.lists(st.one_of(*EVENTS.values()), max_size=20))
def test_a_frame_of_events_round_trips_in_order(events):
    flat.forget_strings()
    frame = pickle.loads(pickle.dumps([flat.flatten(e) for e in events], protocol=5))
    assert [flat.unflatten(t) for t in frame] == events


def test_the_flat_form_is_plain_data():
    spec = JobSpec(name="j", team="t", resources=WorkerResources(gpus=2, gpu_models=("H100-80GB",)))
    event = ev.JobSubmitted(event_id="e1", time=1.5, producer="p", job_id="j", spec=spec)
    flat.forget_strings()
    t = flat.flatten(event)
    assert t[0] == flat.EVENT_CLASSES.index(ev.JobSubmitted)
    assert t[1:4] == ("e1", 1.5, "p")

    def plain(x):
        return isinstance(x, (str, int, float, bool)) or (type(x) is tuple and all(map(plain, x)))
    assert plain(t)


def test_equal_gpu_slots_come_back_as_one_shared_object():
    placed = [ev.JobPlaced(event_id=f"e{i}", job_id=f"j{i}", attempt=0,
                           workers=(WorkerAssignment(0, "n1", (GpuSlot(3), GpuSlot(4, 500))),))
              for i in range(2)]
    a, b = (flat.unflatten(flat.flatten(e)) for e in placed)
    assert a == placed[0] and b == placed[1]
    assert a.workers[0].gpus[0] is b.workers[0].gpus[0]
    assert a.workers[0].gpus[1] is b.workers[0].gpus[1]


def test_the_intern_cache_stays_bounded_and_rebuilding_stays_right():
    limit = flat.INTERN_LIMIT
    events = [ev.JobPlaced(event_id=f"e{i}", job_id="j", attempt=0,
                           workers=(WorkerAssignment(0, "n", (GpuSlot(i),)),)) for i in range(limit + 50)]
    rebuilt = [flat.unflatten(flat.flatten(e)) for e in events]
    assert rebuilt == events
    cache = flat._builder(GpuSlot).__globals__["_cache"]
    assert len(cache) <= limit


def test_strings_are_shared_until_forgotten():
    def started(i: int, job: str) -> ev.WorkerStarted:
        # built from pieces, so equal strings start as distinct objects
        return ev.WorkerStarted(event_id=f"e{i}", job_id="".join(["jo", job]), attempt=0, worker=0,
                                node="".join(["no", "de-1"]))
    flat.forget_strings()
    one, two = flat.flatten(started(1, "b-7")), flat.flatten(started(2, "b-7"))
    job_at, node_at = 4, 7   # code, event_id, time, producer, job_id, attempt, worker, node
    assert one[job_at] == "job-7" and one[node_at] == "node-1"
    assert one[job_at] is two[job_at] and one[node_at] is two[node_at]
    assert one[1] is not two[1]   # event ids are unique: never memoised
    flat.forget_strings()
    three = flat.flatten(started(3, "b-7"))
    assert three[job_at] == one[job_at] and three[job_at] is not one[job_at]


@pytest.mark.parametrize("cls, problem", [
    (dataclasses.make_dataclass("Unslotted", [("x", int)], frozen=True), "not a plain slotted"),
    (dataclasses.make_dataclass("Checked", [("x", int)], frozen=True, slots=True,
                                namespace={"__post_init__": lambda self: None}), "not a plain slotted"),
])
def test_only_plain_slotted_dataclasses_can_be_rebuilt_slot_by_slot(cls, problem):
    with pytest.raises(TypeError, match=problem):
        flat._check_plain_slots(cls)


# --- decode_flat: the catch-up reader reads the flat form straight from the protobuf ----
def _flat_outcome(fn, blob: bytes):
    try:
        return fn(blob)
    except codec.DecodeError:
        return "DecodeError"
    except codec.NewerLogSchema as exc:   # a damaged schema field can read as a later schema
        return ("NewerLogSchema", exc.schema, exc.producer)


@pytest.mark.parametrize("cls", list(EVENTS), ids=lambda c: c.__name__)
@FAST
@given(data=st.data())
def test_decode_flat_is_the_flat_form_of_decode(cls, data):
    event = data.draw(EVENTS[cls])
    blob = codec.encode(event, "p")
    assert codec.decode_flat(blob) == flat.flatten(codec.decode(blob)[0]) == flat.flatten(event)


@pytest.mark.parametrize("blob", [b for _, b in CODEC_BAD], ids=[n for n, _ in CODEC_BAD])
def test_decode_flat_rejects_what_decode_rejects(blob):
    with pytest.raises(codec.DecodeError):
        codec.decode_flat(blob)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(event=any_event, data=st.data())
def test_decode_flat_agrees_with_decode_on_damaged_records(event, data):
    blob = bytearray(codec.encode(event, "p"))
    for _ in range(data.draw(st.integers(0, 3))):
        if blob:
            blob[data.draw(st.integers(0, len(blob) - 1))] ^= data.draw(st.integers(1, 255))
    fast = _flat_outcome(codec.decode_flat, bytes(blob))
    slow = _flat_outcome(lambda b: flat.flatten(codec.decode(b)[0]), bytes(blob))
    # by repr too: a flipped bit can make a float NaN, and NaN != NaN
    assert fast == slow or repr(fast) == repr(slow)


def test_unset_optional_fields_come_back_as_the_flat_defaults():
    env = events_pb2.EventEnvelope(event_id="e1", type="JobSubmitted")
    env.job_submitted.job_id = "j"
    env.job_submitted.spec.name = "j"
    env.job_submitted.spec.kind = types_pb2.JOB_KIND_TRAINING
    blob = env.SerializeToString()
    assert codec.decode_flat(blob) == flat.flatten(codec.decode(blob)[0])
    assert codec.decode(blob)[0].spec.max_restarts == 3   # the dataclass default, not proto's 0
