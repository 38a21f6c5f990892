"""Usage records (topic ``<prefix>usage``): what one worker's GPUs did over a window.

Plain frozen dataclasses and their wire form (``gpusched.v1.WorkerUsage``). Decoding
checks every field a consumer relies on, so a malformed record is rejected with the
field named (it goes to the dead-letter topic) instead of skewing a report.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from google.protobuf.message import DecodeError as ProtoDecodeError

from gpusched.v1 import usage_pb2

UNMEASURED = -1.0   # a measurement NVML could not give (MIG SM utilization, NOT_SUPPORTED)


class UsageRecordError(ValueError):
    """A usage record that cannot be folded; the message names the field."""


@dataclass(frozen=True, slots=True)
class GpuSample:
    index: int
    uuid: str
    milli: int                       # the worker's part of the GPU (1000: whole)
    sm_percent: float = UNMEASURED   # the whole GPU's, also for a share
    memory_used_mib: int = -1
    power_w: float = UNMEASURED
    mig_profile: str = ""

    @property
    def measured(self) -> bool:
        return self.sm_percent >= 0


@dataclass(frozen=True, slots=True)
class WorkerUsage:
    record_id: str
    node: str
    pool: str
    job_id: str
    attempt: int
    worker: int
    time: float
    window_s: float
    gpus: tuple[GpuSample, ...] = ()
    simulated: bool = False
    requests_in_flight: float = UNMEASURED   # a service's replica: what it reported (-1: nothing)
    requests_total: float = UNMEASURED

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.job_id, self.attempt, self.worker)


def encode_usage(usage: WorkerUsage) -> bytes:
    msg = usage_pb2.WorkerUsage(
        record_id=usage.record_id, node=usage.node, pool=usage.pool, job_id=usage.job_id,
        attempt=usage.attempt, worker=usage.worker, time=usage.time, window_s=usage.window_s,
        simulated=usage.simulated)
    if usage.requests_in_flight != UNMEASURED:
        msg.requests_in_flight = usage.requests_in_flight
    if usage.requests_total != UNMEASURED:
        msg.requests_total = usage.requests_total
    for g in usage.gpus:
        msg.gpus.add(index=g.index, uuid=g.uuid, milli=g.milli, mig_profile=g.mig_profile,
                     sm_percent=g.sm_percent, memory_used_mib=g.memory_used_mib, power_w=g.power_w)
    return msg.SerializeToString()


def decode_usage(data: bytes) -> WorkerUsage:
    """The record in ``data``; UsageRecordError naming the first bad field."""
    try:
        msg = usage_pb2.WorkerUsage.FromString(data)
    except ProtoDecodeError as exc:
        raise UsageRecordError(f"not a WorkerUsage record: {exc}") from exc
    for name in ("record_id", "node", "job_id"):
        if not getattr(msg, name):
            raise UsageRecordError(f"{name}: empty")
    if msg.attempt < 0 or msg.worker < 0:
        raise UsageRecordError(f"{'attempt' if msg.attempt < 0 else 'worker'}: negative")
    if not (math.isfinite(msg.time) and msg.time > 0):
        raise UsageRecordError(f"time: {msg.time!r} is not a positive time")
    if not (math.isfinite(msg.window_s) and msg.window_s > 0):
        raise UsageRecordError(f"window_s: {msg.window_s!r} is not a positive duration")
    requests = []
    for name in ("requests_in_flight", "requests_total"):
        value = getattr(msg, name) if msg.HasField(name) else UNMEASURED
        if not (value == UNMEASURED or 0.0 <= value < math.inf):
            raise UsageRecordError(f"{name}: {value!r} is not a count")
        requests.append(value)
    gpus = tuple(_gpu(i, g) for i, g in enumerate(msg.gpus))
    return WorkerUsage(msg.record_id, msg.node, msg.pool, msg.job_id, msg.attempt, msg.worker,
                       msg.time, msg.window_s, gpus, msg.simulated, *requests)


def _gpu(i: int, g) -> GpuSample:
    where = f"gpus[{i}]"
    if not 1 <= g.milli <= 1000:
        raise UsageRecordError(f"{where}.milli: {g.milli} is not in 1..1000")
    # -1 is "not measured"; anything else must be a percentage
    if not (g.sm_percent == UNMEASURED or 0.0 <= g.sm_percent <= 100.0):
        raise UsageRecordError(f"{where}.sm_percent: {g.sm_percent!r} is neither -1 nor in 0..100")
    if not (g.power_w == UNMEASURED or 0.0 <= g.power_w < math.inf):
        raise UsageRecordError(f"{where}.power_w: {g.power_w!r} is neither -1 nor >= 0")
    if g.memory_used_mib < -1:
        raise UsageRecordError(f"{where}.memory_used_mib: {g.memory_used_mib} is below -1")
    return GpuSample(g.index, g.uuid, g.milli, g.sm_percent, g.memory_used_mib, g.power_w, g.mig_profile)
