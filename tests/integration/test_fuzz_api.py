"""Random and mutated requests to a running admission, as raw bytes through a generic
channel call (so invalid protobuf reaches the server): only well-formed statuses come
back, never UNKNOWN or INTERNAL, and the service is still serving afterwards."""
from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpusched.client import CHANNEL_OPTIONS, spec
from gpusched.local_cluster import LocalCluster
from gpusched.v1 import admission_pb2, cluster_pb2, types_pb2

WELL_FORMED = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
               grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.FAILED_PRECONDITION,
               grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.PERMISSION_DENIED,
               grpc.StatusCode.UNAUTHENTICATED}

_VALID_SUBMIT = admission_pb2.SubmitJobRequest(spec=spec("fuzz", "fuzz", gpus=1, duration=0.1, command=("a", "b")),
                                               idempotency_key="k")
# Unary methods and a valid request of each: the seeds that are mutated.
METHODS = {
    "/gpusched.v1.AdmissionService/SubmitJob": _VALID_SUBMIT,
    "/gpusched.v1.AdmissionService/SubmitJobs": admission_pb2.SubmitJobsRequest(jobs=[_VALID_SUBMIT] * 2),
    "/gpusched.v1.AdmissionService/GetJob": admission_pb2.GetJobRequest(job_id="job-1"),
    "/gpusched.v1.AdmissionService/ListJobs": admission_pb2.ListJobsRequest(team="fuzz", phases=[1, 2], page_size=3),
    "/gpusched.v1.AdmissionService/CancelJob": admission_pb2.CancelJobRequest(job_id="job-1", reason="r"),
    "/gpusched.v1.ClusterService/GetNode": cluster_pb2.GetNodeRequest(name="n"),
    "/gpusched.v1.ClusterService/CordonNode": cluster_pb2.CordonNodeRequest(name="n", reason="r"),
    "/gpusched.v1.ClusterService/CreatePool": cluster_pb2.CreatePoolRequest(pool="p"),
    "/gpusched.v1.ClusterService/SetPoolTimeLimits": cluster_pb2.SetPoolTimeLimitsRequest(pool="p", max_time_limit={"seconds": 5}),
    "/gpusched.v1.ClusterService/SetPoolTopology": cluster_pb2.SetPoolTopologyRequest(pool="p", levels=["rack", "block"]),
}
WRONG_TYPES = [types_pb2.Job(job_id="j", reason="r").SerializeToString(),
               admission_pb2.SubmitJobsRequest(jobs=[_VALID_SUBMIT]).SerializeToString(),
               types_pb2.JobSpec(workers=-1, name="\u00e9" * 10).SerializeToString()]


@st.composite
def payloads(draw) -> tuple[str, bytes]:
    method = draw(st.sampled_from(sorted(METHODS)))
    seed = METHODS[method].SerializeToString()
    kind = draw(st.sampled_from(["random", "flips", "splice", "huge", "wrong-type"]))
    if kind == "random":
        return method, draw(st.binary(max_size=256))
    if kind == "flips":
        data = bytearray(seed)
        for _ in range(draw(st.integers(1, 8))):
            i = draw(st.integers(0, len(data) - 1))
            data[i] ^= 1 << draw(st.integers(0, 7))
        return method, bytes(data)
    if kind == "splice":   # a valid prefix, then garbage: truncated or overlong fields
        cut = draw(st.integers(0, len(seed)))
        return method, seed[:cut] + draw(st.binary(max_size=32))
    if kind == "huge":     # field 1 (a string or a message) of 2-20 MB: the limits, not the broker, answer
        size = draw(st.sampled_from([2_000_000, 20_000_000]))
        varint, n = bytearray(), size
        while n >= 0x80:
            varint.append(n & 0x7F | 0x80)
            n >>= 7
        return method, b"\x0a" + bytes(varint) + n.to_bytes(1, "little") + b"a" * size
    return method, draw(st.sampled_from(WRONG_TYPES))


async def test_fuzzed_requests_get_only_well_formed_statuses_and_the_service_stays_up(kafka_bootstrap, topics, tmp_path):
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path)
    admission = await cluster.admission()
    # A blocking channel: the admission is another process, and hypothesis drives a plain function.
    channel = grpc.insecure_channel(f"127.0.0.1:{admission.port}", options=CHANNEL_OPTIONS)
    seen: dict[grpc.StatusCode, int] = {}
    try:
        @settings(max_examples=150, deadline=None, derandomize=True,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
        @given(payloads())
        def fuzz(case: tuple[str, bytes]) -> None:
            method, payload = case
            try:
                channel.unary_unary(method)(payload, timeout=20)
                code, details = grpc.StatusCode.OK, ""
            except grpc.RpcError as exc:
                code, details = exc.code(), exc.details()
            seen[code] = seen.get(code, 0) + 1
            assert code in WELL_FORMED, (method, payload[:64], code, details)

        fuzz()
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        assert admission.alive
        assert seen.get(grpc.StatusCode.INVALID_ARGUMENT, 0) > 10, seen   # the fuzzing reached the checks
    finally:
        channel.close()
        await cluster.stop_all()
