"""The flat form events take between the catch-up reader and the follower: every event
comes back equal from its tuples, through pickle, with value objects and strings shared
as designed."""
from __future__ import annotations

import dataclasses
import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpusched.adapters import flat
from gpusched.core import events as ev
from gpusched.core.model import GpuSlot, JobSpec, WorkerAssignment, WorkerResources
from tests.unit.adapters.test_codec import EVENTS, FAST


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
    assert flat.unflatten_all(frame) == events


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
