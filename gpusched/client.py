"""A small async client for the gpusched API, for training platforms, the demo and tests."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

import grpc

from gpusched.v1 import admission_pb2, admission_pb2_grpc, cluster_pb2, cluster_pb2_grpc, types_pb2


TERMINAL = frozenset({types_pb2.JOB_PHASE_SUCCEEDED, types_pb2.JOB_PHASE_FAILED, types_pb2.JOB_PHASE_CANCELLED,
                      types_pb2.JOB_PHASE_TIMEOUT})


def spec(name: str, team: str, *, gpus: int = 0, gpu_milli: int = 0, mig: str = "", workers: int = 1,
         duration: float = 0.0, priority: str = "training", pool: str = "default",
         cpu_milli: int = 1000, memory_mib: int = 4096, models: tuple[str, ...] = (),
         command: tuple[str, ...] = (), preemptible: bool = True, checkpoint_interval: float = 0.0,
         max_runtime: float = 0.0, kind: int = types_pb2.JOB_KIND_TRAINING,
         gpu_memory_mib: int = 0) -> types_pb2.JobSpec:
    return types_pb2.JobSpec(
        name=name, team=team, pool=pool, priority_class=priority, kind=kind, workers=workers,
        resources=types_pb2.WorkerResources(gpus=gpus, gpu_milli=gpu_milli, mig_profile=mig,
                                            cpu_milli=cpu_milli, memory_mib=memory_mib, gpu_models=models,
                                            gpu_memory_mib=gpu_memory_mib),
        simulated_duration_s=duration, command=command, preemptible=preemptible,
        checkpoint_interval_s=checkpoint_interval, max_runtime_s=max_runtime,
    )


# The servers' limits (gpusched.adapters.grpc_server), mirrored: a client sends what a
# server receives and takes the largest answer a server sends.
CHANNEL_OPTIONS = [("grpc.max_send_message_length", 16 * 1024 * 1024),
                   ("grpc.max_receive_message_length", 128 * 1024 * 1024)]


@dataclass(frozen=True)
class ClientTls:
    """PEM bytes: the CA that signed the server's certificate, and, for mutual TLS, this
    client's certificate and key (its subject is the principal)."""

    ca: bytes
    cert: bytes | None = None
    key: bytes | None = None

    @classmethod
    def from_files(cls, ca: str | Path, cert: str | Path | None = None, key: str | Path | None = None) -> "ClientTls":
        return cls(Path(ca).read_bytes(), Path(cert).read_bytes() if cert else None,
                   Path(key).read_bytes() if key else None)


def channel(target: str, tls: ClientTls | None = None, token: str = "") -> grpc.aio.Channel:
    """Plaintext without ``tls`` (the ``--insecure`` dev mode); else TLS, with the bearer
    token sent on every call where given."""
    if tls is None:
        if token:
            raise ValueError("a bearer token needs TLS: give tls as well")
        return grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS)
    credentials = grpc.ssl_channel_credentials(tls.ca, tls.key, tls.cert)
    if token:
        credentials = grpc.composite_channel_credentials(credentials, grpc.access_token_call_credentials(token))
    return grpc.aio.secure_channel(target, credentials, options=CHANNEL_OPTIONS)


class Client:
    def __init__(self, target: str, tls: ClientTls | None = None, token: str = "") -> None:
        self.channel = channel(target, tls, token)
        self.jobs = admission_pb2_grpc.AdmissionServiceStub(self.channel)
        self.cluster = cluster_pb2_grpc.ClusterServiceStub(self.channel)

    async def close(self) -> None:
        await self.channel.close()

    async def submit(self, job_spec: types_pb2.JobSpec, key: str = "") -> admission_pb2.SubmitJobResponse:
        return await self.jobs.SubmitJob(admission_pb2.SubmitJobRequest(spec=job_spec, idempotency_key=key))

    async def submit_many(self, items: list[tuple[types_pb2.JobSpec, str]]) -> list[admission_pb2.SubmitJobResponse]:
        """(spec, idempotency key) pairs in one SubmitJobs call; results in the same order."""
        request = admission_pb2.SubmitJobsRequest(
            jobs=[admission_pb2.SubmitJobRequest(spec=s, idempotency_key=k) for s, k in items])
        return list((await self.jobs.SubmitJobs(request)).results)

    async def get(self, job_id: str) -> types_pb2.Job:
        return await self.jobs.GetJob(admission_pb2.GetJobRequest(job_id=job_id))

    async def list_all(self, **filters) -> list[types_pb2.Job]:
        jobs, token = [], ""
        while True:
            page = await self.jobs.ListJobs(admission_pb2.ListJobsRequest(page_size=1000, page_token=token, **filters))
            jobs.extend(page.jobs)
            token = page.next_page_token
            if not token:
                return jobs

    async def summary(self, pool: str = "default") -> cluster_pb2.PoolSummary:
        return await self.cluster.GetPoolSummary(cluster_pb2.GetPoolSummaryRequest(pool=pool))

    async def nodes(self, pool: str = "") -> list[types_pb2.Node]:
        return list((await self.cluster.ListNodes(cluster_pb2.ListNodesRequest(pool=pool))).nodes)

    async def wait_terminal(self, job_ids: set[str], timeout: float = 600.0) -> list[types_pb2.Job]:
        """Follow WatchJobs (current state first, then changes) until every job has ended."""
        done: dict[str, types_pb2.Job] = {}
        stream = self.jobs.WatchJobs(admission_pb2.WatchJobsRequest())

        async def follow() -> None:
            async for update in stream:
                if update.job.job_id in job_ids and update.job.phase in TERMINAL:
                    done[update.job.job_id] = update.job
                    if len(done) == len(job_ids):
                        return
        try:
            await asyncio.wait_for(follow(), timeout)
        finally:
            stream.cancel()
        return list(done.values())
