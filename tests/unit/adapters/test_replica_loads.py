"""A replica's load as the autoscaler reads it (``adapters.nodes.replica_loads``): requests
a second from the rise of its counter within one attempt, GPU utilization as the mean of
its measured GPUs, other workers ignored, stale replicas dropped; and usage records
carrying request counts survive their wire form, a negative count refused by name."""
from __future__ import annotations

import pytest

from gpusched.adapters.nodes.replica_loads import ReplicaLoads
from gpusched.adapters.nodes.usage_records import (
    UNMEASURED, GpuSample, UsageRecordError, WorkerUsage, decode_usage, encode_usage,
)
from gpusched.v1 import usage_pb2


def usage(job: str, time: float, in_flight: float = UNMEASURED, total: float = UNMEASURED, attempt: int = 0,
          worker: int = 0, sm: tuple[float, ...] = ()) -> WorkerUsage:
    gpus = tuple(GpuSample(i, f"u{i}", 1000, s) for i, s in enumerate(sm))
    return WorkerUsage(f"{job}-{time}", "n1", "default", job, attempt, worker, time, 5.0, gpus, False, in_flight, total)


def test_requests_per_second_come_from_the_counter_within_one_attempt():
    loads = ReplicaLoads()
    loads.add(usage("web-1", 100.0, 3.0, 1000.0, sm=(40.0, 60.0)))
    assert loads["web-1"].per_second == UNMEASURED and loads["web-1"].in_flight == 3.0
    assert loads["web-1"].gpu_percent == 50.0
    loads.add(usage("web-1", 110.0, 2.0, 1250.0))
    assert loads["web-1"].per_second == 25.0 and loads["web-1"].gpu_percent == UNMEASURED
    loads.add(usage("web-1", 120.0, 2.0, 10.0, attempt=1))          # a new attempt's counter starts over
    assert loads["web-1"].per_second == UNMEASURED
    loads.add(usage("web-1", 130.0, 0.0, 10.0, attempt=1))
    assert loads["web-1"].per_second == 0.0 and loads["web-1"].idle


def test_other_workers_are_ignored_and_stale_replicas_dropped():
    loads = ReplicaLoads(keep_s=60.0)
    loads.add(usage("web-1", 100.0, 1.0, worker=1))
    assert "web-1" not in loads
    loads.add(usage("web-1", 100.0, 1.0))
    loads.add(usage("web-2", 200.0, 1.0))
    assert set(loads) == {"web-2"}


def test_request_counts_survive_the_wire_and_bad_ones_are_refused():
    record = usage("web-1", 100.0, 4.0, 77.0)
    assert decode_usage(encode_usage(record)) == record
    plain = usage("job-1", 100.0)
    assert decode_usage(encode_usage(plain)).requests_in_flight == UNMEASURED
    msg = usage_pb2.WorkerUsage.FromString(encode_usage(record))
    msg.requests_in_flight = -3.0
    with pytest.raises(UsageRecordError, match="requests_in_flight"):
        decode_usage(msg.SerializeToString())
