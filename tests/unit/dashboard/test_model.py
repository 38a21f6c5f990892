"""The dashboard's figures and records, from hand-built API messages (no broker)."""
from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from gpusched.dashboard.model import EventBook, History, allocation, fragmentation, gpu_state, timeline
from gpusched.v1 import types_pb2

READY, CORDONED = types_pb2.NODE_STATUS_READY, types_pb2.NODE_STATUS_CORDONED


def gpu(milli: int = 0, mig: int = 0, healthy: bool = True, index: int = 0, mig_milli: int = 0) -> types_pb2.Gpu:
    """``mig``: the memory slices MIG instances hold; ``mig_milli``: what they count
    (their compute sevenths, as the API's ``allocated_milli``)."""
    return types_pb2.Gpu(info=types_pb2.GpuInfo(index=index, model="H100-80GB"), healthy=healthy,
                         used_milli=milli, mig_slices_used=mig, allocated_milli=milli + mig_milli)


def node(*gpus: types_pb2.Gpu, status: int = READY, pool: str = "default", name: str = "n") -> types_pb2.Node:
    return types_pb2.Node(info=types_pb2.NodeInfo(name=name, pool=pool), status=status, gpus=gpus)


@pytest.mark.parametrize("g, state", [
    (gpu(), "free"), (gpu(1000), "whole"), (gpu(250), "share"), (gpu(mig=0b1111), "mig"),
    (gpu(1000, healthy=False), "faulty"), (gpu(mig=0b1, healthy=False), "faulty"),
])
def test_gpu_state(g, state):
    assert gpu_state(g) == state


@pytest.mark.parametrize("nodes, alloc, frag", [
    ([node(gpu(), gpu())], 0.0, 0.0),                          # all free, all whole
    ([node(gpu(1000), gpu())], 0.5, 0.0),                      # one whole GPU used
    ([node(gpu(250), gpu())], 0.125, 0.75 / 1.75),             # a share strands 0.75
    ([node(gpu(mig=0b11110000, mig_milli=428), gpu())], 0.214, 0.572 / 1.572),   # a 3g slice: 3 of 7 compute
    ([node(gpu(1000), gpu(1000))], 1.0, 0.0),                  # nothing free
    ([node(gpu(250), gpu(healthy=False))], 0.25, 1.0),         # a faulty GPU offers nothing
    ([node(gpu(250)), node(gpu(), gpu(), status=CORDONED)], 0.25, 1.0),   # nor a cordoned node
    ([node(status=CORDONED)], 0.0, 0.0),
])
def test_allocation_and_fragmentation(nodes, alloc, frag):
    assert allocation(nodes) == pytest.approx(alloc)
    assert fragmentation(nodes) == pytest.approx(frag)


gpus = st.builds(gpu, milli=st.sampled_from([0, 100, 250, 500, 999, 1000]),
                 mig=st.integers(0, 255), healthy=st.booleans(), mig_milli=st.sampled_from([0, 142, 428, 1000]))


@given(st.lists(gpus, max_size=8))
def test_figures_are_shares(gs):
    nodes = [node(*gs)]
    assert 0.0 <= allocation(nodes) <= 1.0 and 0.0 <= fragmentation(nodes) <= 1.0


@given(st.lists(st.sampled_from([0, 1000]), max_size=8))
def test_whole_gpus_leave_no_fragmentation(millis):
    assert fragmentation([node(*(gpu(m) for m in millis))]) == 0.0


def test_history_keeps_the_last_samples_per_pool():
    history = History(size=3)
    for t in range(5):
        history.record([node(gpu(1000 if t % 2 else 0), pool="a"), node(gpu(), pool="b", name="m")], t=float(t))
    pools = history.pools()
    assert list(pools) == ["a", "b"]
    assert [(s.t, s.allocation) for s in pools["a"]] == [(2.0, 0.0), (3.0, 1.0), (4.0, 0.0)]


def job(**fields) -> types_pb2.Job:
    """``submitted_at=10``: the API's Timestamp of that epoch second."""
    times = {name: {"seconds": value} for name, value in fields.items() if name.endswith("_at")}
    return types_pb2.Job(job_id="job-1", spec=types_pb2.JobSpec(name="j"), **{**fields, **times})


def test_timeline_merges_the_fields_and_the_events_seen_in_time_order():
    events = EventBook()
    j = job(phase=types_pb2.JOB_PHASE_SUCCEEDED, submitted_at=10, placed_at=11, started_at=12, ended_at=20)
    events.record(j, "Current", -1, t=10.5)                  # a watch's first answer: no event
    events.record(j, "JobPlaced", 7, t=11.5)
    events.record(j, "WorkerFinished", 9, t=20.5)
    steps = timeline(j, events.of("job-1"))
    assert [(s.t, s.label) for s in steps] == [(10, "Submitted"), (11, "Placed"), (11.5, "JobPlaced"),
                                              (12, "Started"), (20, "Ended: SUCCEEDED"), (20.5, "WorkerFinished")]
    assert steps[2].detail == "SUCCEEDED (offset 7)"


def test_timeline_of_a_job_still_waiting_has_its_submission_only():
    assert [s.label for s in timeline(job(phase=types_pb2.JOB_PHASE_PENDING, submitted_at=3), [])] == ["Submitted"]


def test_event_book_is_bounded_per_job_and_in_jobs():
    events = EventBook(per_job=2, jobs=2)
    for i in range(3):
        events.record(job(attempt=i), "JobPlaced", i)
    assert [e.offset for e in events.of("job-1")] == [1, 2]
    for other in ("job-2", "job-3"):
        events.record(types_pb2.Job(job_id=other), "JobSubmitted", 0)
    assert events.of("job-1") == [] and len(events.of("job-3")) == 1
