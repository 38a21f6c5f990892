"""The API's times and defaults: instants are google.protobuf.Timestamp, spans Duration,
bad spans are INVALID_ARGUMENT naming the field; ``preemptible`` left unset means true,
over raw gRPC and through the client, and the log records what was meant."""
from __future__ import annotations

import struct
from datetime import datetime, timedelta, timezone

import grpc
import pytest

from gpusched.adapters.log import codec
from gpusched.client import Client, instant, seconds, span, spec
from gpusched.core import events as ev
from gpusched.v1 import admission_pb2, types_pb2
from tests.integration.logcheck import read_log
from tests.integration.cluster_calls import SUCCEEDED


async def test_a_jobs_instants_are_timestamps_and_its_spans_durations(api):
    _, client = api
    before = datetime.now(timezone.utc)
    job = (await client.submit(spec("timed", "nlp", gpus=1, duration=0.25, max_runtime=timedelta(minutes=30),
                                    checkpoint_interval=90))).job
    assert not job.HasField("ended_at") and instant(job.ended_at) is None   # not yet: unset
    (done,) = await client.wait_terminal({job.job_id})
    assert done.phase == SUCCEEDED
    times = [instant(getattr(done, name)) for name in ("submitted_at", "placed_at", "started_at", "ended_at")]
    assert all(t is not None and t.tzinfo is timezone.utc for t in times), times
    assert before - timedelta(seconds=1) <= times[0] <= times[1] <= times[2] <= times[3] <= datetime.now(timezone.utc)
    assert abs(seconds(done.submitted_at) - times[0].timestamp()) < 1e-3
    assert span(done.time_limit) == timedelta(minutes=30) == span(done.spec.max_runtime)
    assert span(done.spec.checkpoint_interval) == timedelta(seconds=90)
    assert span(done.spec.simulated_duration) == timedelta(seconds=0.25)


def _raw_spec(**fields) -> types_pb2.JobSpec:
    return types_pb2.JobSpec(name="raw", team="nlp", resources=types_pb2.WorkerResources(gpus=1), **fields)


BAD_SPANS = [
    (_raw_spec(max_runtime={"seconds": -5}), "spec.max_runtime: must not be negative"),
    (_raw_spec(checkpoint_interval={"nanos": -1}), "spec.checkpoint_interval: must not be negative"),
    (_raw_spec(simulated_duration={"seconds": -1, "nanos": -500_000_000}), "spec.simulated_duration: must not be"),
    (_raw_spec(max_runtime={"seconds": 1, "nanos": 1_000_000_000}), "spec.max_runtime: not a valid google.protobuf"),
    (_raw_spec(max_runtime={"seconds": 5, "nanos": -1}), "spec.max_runtime: not a valid google.protobuf"),
    (_raw_spec(simulated_duration={"seconds": 10**12}), "spec.simulated_duration: not a valid google.protobuf"),
]


@pytest.mark.parametrize("bad, message", BAD_SPANS, ids=[m.split(":")[0] + f"-{i}" for i, (_, m) in enumerate(BAD_SPANS)])
async def test_a_bad_span_is_invalid_argument_naming_the_field(api, bad, message):
    _, client = api
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await client.jobs.SubmitJob(admission_pb2.SubmitJobRequest(spec=bad))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith(message), err.value.details()
    assert await client.list_all() == []


async def test_a_caller_still_sending_seconds_as_doubles_is_told_the_new_field(api):
    """Field 8 (max_runtime_s) of the old layout: refused, not dropped without a word."""
    _, client = api
    old = _raw_spec().SerializeToString() + bytes([8 << 3 | 1]) + struct.pack("<d", 3600.0)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await client.jobs.SubmitJob(admission_pb2.SubmitJobRequest(spec=types_pb2.JobSpec.FromString(old)))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith("spec.max_runtime_s: replaced by spec.max_runtime"), err.value.details()


async def _submitted_preemptible(kafka_bootstrap, topics) -> dict[str, bool]:
    """What the log's JobSubmitted events say, by job name."""
    log = await read_log(kafka_bootstrap, topics)
    events = [codec.decode(value)[0] for records in log.values() for _, value in records]
    return {e.spec.name: e.spec.preemptible for e in events if isinstance(e, ev.JobSubmitted)}


async def test_preemptible_left_unset_is_true_over_raw_grpc_and_through_the_client(api, kafka_bootstrap, topics):
    _, client = api
    raw = {"raw-true": _raw_spec(preemptible=True), "raw-false": _raw_spec(preemptible=False), "raw-unset": _raw_spec()}
    for name, s in raw.items():
        s.name = name
        await client.jobs.SubmitJob(admission_pb2.SubmitJobRequest(spec=s))
    for name, value in (("client-true", True), ("client-false", False), ("client-unset", None)):
        await client.submit(spec(name, "nlp", gpus=1, duration=0.1, preemptible=value))
    expected = {"raw-true": True, "raw-false": False, "raw-unset": True,
                "client-true": True, "client-false": False, "client-unset": True}
    shown = {j.spec.name: j.spec.preemptible for j in await client.list_all(team="nlp")}
    assert shown == expected
    assert all(j.spec.HasField("preemptible") for j in await client.list_all(team="nlp"))   # the API says which
    assert await _submitted_preemptible(kafka_bootstrap, topics) == expected   # the log records the default applied
