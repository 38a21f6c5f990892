"""The Python client for the gpusched API: ``Client`` (asyncio) and ``SyncClient``
(blocking, ``connect()``), for training platforms, the CLI, the demo and tests.

Results are the API's own protobuf messages (``types_pb2.Job``, ``types_pb2.Node``, ...),
so a field added to the API is there without a client release. Their times are
``google.protobuf.Timestamp`` (instants, unset until they happen) and ``Duration`` (spans):
``instant()`` and ``span()`` give them as ``datetime``/``timedelta``, ``seconds()`` as
float seconds; ``spec()`` takes spans as float seconds or ``timedelta``. Calls that are safe to
repeat are retried on ``UNAVAILABLE`` (admission restarting, a connection lost mid-call);
a submission is retried with the same idempotency key, so a retry that follows a
submission the server did record answers that job instead of making a second one
(docs/reference/client.md). While an OpenTelemetry span is current, each call carries its W3C
trace context (``traceparent`` metadata): a job submitted inside the caller's span is
traced as part of the caller's trace (docs/reference/observability.md)."""
from __future__ import annotations

import asyncio
import contextlib
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import AsyncIterator, Iterator, Sequence, TypeVar

import grpc
from google.protobuf import duration_pb2, timestamp_pb2
from opentelemetry import propagate

from gpusched.v1 import admission_pb2, admission_pb2_grpc, cluster_pb2, cluster_pb2_grpc, types_pb2


TERMINAL = frozenset({types_pb2.JOB_PHASE_SUCCEEDED, types_pb2.JOB_PHASE_FAILED, types_pb2.JOB_PHASE_CANCELLED,
                      types_pb2.JOB_PHASE_TIMEOUT})
DEFAULT_ENDPOINT = "127.0.0.1:50051"
T = TypeVar("T")


Seconds = float | timedelta


def duration_of(value: Seconds) -> duration_pb2.Duration:
    """A span (float seconds or ``timedelta``) as the API's Duration."""
    span = duration_pb2.Duration()
    if isinstance(value, timedelta):
        span.FromTimedelta(value)
    else:
        span.FromNanoseconds(round(value * 1e9))
    return span


def spec(name: str, team: str, *, gpus: int = 0, gpu_milli: int = 0, mig: str = "", workers: int = 1,
         duration: Seconds = 0.0, priority: str = "training", pool: str = "default",
         cpu_milli: int = 1000, memory_mib: int = 4096, models: tuple[str, ...] = (),
         command: tuple[str, ...] = (), preemptible: bool | None = None, checkpoint_interval: Seconds = 0.0,
         max_runtime: Seconds = 0.0, kind: int = types_pb2.JOB_KIND_TRAINING,
         gpu_memory_mib: int = 0) -> types_pb2.JobSpec:
    """A JobSpec with the defaults of the CLI and job files (docs/reference/client.md): one worker,
    pool ``default``, class ``training``. ``preemptible`` None leaves it unset: the API's
    default, preemptible."""
    msg = types_pb2.JobSpec(
        name=name, team=team, pool=pool, priority_class=priority, kind=kind, workers=workers,
        resources=types_pb2.WorkerResources(gpus=gpus, gpu_milli=gpu_milli, mig_profile=mig,
                                            cpu_milli=cpu_milli, memory_mib=memory_mib, gpu_models=models,
                                            gpu_memory_mib=gpu_memory_mib),
        simulated_duration=duration_of(duration), command=command,
        checkpoint_interval=duration_of(checkpoint_interval), max_runtime=duration_of(max_runtime),
    )
    if preemptible is not None:
        msg.preemptible = preemptible
    return msg


def instant(value: timestamp_pb2.Timestamp) -> datetime | None:
    """A result's instant as an aware UTC ``datetime``; None while unset (not yet)."""
    if not value.seconds and not value.nanos:
        return None
    return value.ToDatetime(tzinfo=timezone.utc)


def span(value: duration_pb2.Duration) -> timedelta:
    return value.ToTimedelta()


def seconds(value: timestamp_pb2.Timestamp | duration_pb2.Duration) -> float:
    """Epoch seconds of an instant (0.0 while unset), or the seconds of a span."""
    return value.seconds + value.nanos / 1e9


# The servers' limits (gpusched.adapters.api.grpc_server), mirrored: a client sends what a
# server receives and takes the largest answer a server sends.
CHANNEL_OPTIONS = [("grpc.max_send_message_length", 16 * 1024 * 1024),
                   ("grpc.max_receive_message_length", 128 * 1024 * 1024)]
# gRPC's own reconnect backoff grows to two minutes; a restarted admission should be
# found again within a retry's budget.
RECONNECT_OPTIONS = [("grpc.initial_reconnect_backoff_ms", 200), ("grpc.max_reconnect_backoff_ms", 2000)]


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


@dataclass(frozen=True)
class Retry:
    """Retries on ``UNAVAILABLE``: exponential backoff from ``initial_s`` up to ``max_s``
    between tries, for at most ``budget_s`` in all (0: no retries)."""

    budget_s: float = 30.0
    initial_s: float = 0.1
    max_s: float = 2.0


NO_RETRY = Retry(budget_s=0.0)


def channel(target: str, tls: ClientTls | None = None, token: str = "") -> grpc.aio.Channel:
    """Plaintext without ``tls`` (the ``--insecure`` dev mode); else TLS, with the bearer
    token sent on every call where given."""
    options = CHANNEL_OPTIONS + RECONNECT_OPTIONS
    if tls is None:
        if token:
            raise ValueError("a bearer token needs TLS: give tls as well")
        return grpc.aio.insecure_channel(target, options=options)
    credentials = grpc.ssl_channel_credentials(tls.ca, tls.key, tls.cert)
    if token:
        credentials = grpc.composite_channel_credentials(credentials, grpc.access_token_call_credentials(token))
    return grpc.aio.secure_channel(target, credentials, options=options)


class Client:
    """The API over one channel. ``async with Client(...) as c:`` closes it at the end."""

    def __init__(self, target: str = DEFAULT_ENDPOINT, tls: ClientTls | None = None, token: str = "",
                 retry: Retry = Retry()) -> None:
        self.channel = channel(target, tls, token)
        self.jobs = admission_pb2_grpc.AdmissionServiceStub(self.channel)
        self.cluster = cluster_pb2_grpc.ClusterServiceStub(self.channel)
        self.services = admission_pb2_grpc.ServiceApiStub(self.channel)
        self.retry = retry

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        await self.channel.close()

    async def _call(self, rpc, request: object, retry: bool = True):
        """One unary call; on ``UNAVAILABLE`` again after a backoff while the budget lasts."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + (self.retry.budget_s if retry else 0.0)
        delay = self.retry.initial_s
        metadata = trace_metadata()
        while True:
            try:
                return await rpc(request, metadata=metadata)
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE or loop.time() + delay > give_up:
                    raise
            await asyncio.sleep(delay)
            delay = min(2 * delay, self.retry.max_s)

    # --- jobs --------------------------------------------------------------------------
    async def submit(self, job_spec: types_pb2.JobSpec, key: str = "") -> admission_pb2.SubmitJobResponse:
        """Submit one job. Without ``key`` the client makes one, so that its retries are
        safe too; ``created`` is false where the key named a job that already existed."""
        request = admission_pb2.SubmitJobRequest(spec=job_spec, idempotency_key=key or new_key())
        return await self._call(self.jobs.SubmitJob, request)

    async def submit_many(self, items: list[tuple[types_pb2.JobSpec, str]]) -> list[admission_pb2.SubmitJobResponse]:
        """(spec, idempotency key) pairs in one SubmitJobs call; results in the same order.
        An empty key gets one made for it (the batch is retried as a whole)."""
        request = admission_pb2.SubmitJobsRequest(
            jobs=[admission_pb2.SubmitJobRequest(spec=s, idempotency_key=k or new_key()) for s, k in items])
        return list((await self._call(self.jobs.SubmitJobs, request)).results)

    async def get(self, job_id: str) -> types_pb2.Job:
        return await self._call(self.jobs.GetJob, admission_pb2.GetJobRequest(job_id=job_id))

    async def list_all(self, team: str = "", pool: str = "", phases: tuple[int, ...] = ()) -> list[types_pb2.Job]:
        """Every job the caller may see, page by page; filters as ``ListJobs``'s."""
        jobs: list[types_pb2.Job] = []
        token = ""
        while True:
            request = admission_pb2.ListJobsRequest(team=team, pool=pool, phases=phases, page_size=1000,
                                                    page_token=token)
            page = await self._call(self.jobs.ListJobs, request)
            jobs.extend(page.jobs)
            token = page.next_page_token
            if not token:
                return jobs

    async def cancel(self, job_id: str, reason: str = "") -> types_pb2.Job:
        """Not retried: a retry after a cancellation that went through would answer
        FAILED_PRECONDITION (the job has ended)."""
        return await self._call(self.jobs.CancelJob, admission_pb2.CancelJobRequest(job_id=job_id, reason=reason),
                                retry=False)

    async def watch(self, team: str = "", job_id: str = "", pool: str = "") -> AsyncIterator[admission_pb2.JobUpdate]:
        """WatchJobs: each matching job's current state first, then every change."""
        stream = self.jobs.WatchJobs(admission_pb2.WatchJobsRequest(team=team, job_id=job_id, pool=pool),
                                     metadata=trace_metadata())
        try:
            async for update in stream:
                yield update
        finally:
            stream.cancel()

    async def wait_terminal(self, job_ids: set[str], timeout: float = 600.0) -> list[types_pb2.Job]:
        """Follow WatchJobs until every job has ended; their final states."""
        done: dict[str, types_pb2.Job] = {}

        async def follow() -> None:
            async with contextlib.aclosing(self.watch()) as updates:   # the stream ends with it
                async for update in updates:
                    if update.job.job_id in job_ids and update.job.phase in TERMINAL:
                        done[update.job.job_id] = update.job
                        if len(done) == len(job_ids):
                            return
        await asyncio.wait_for(follow(), timeout)
        return list(done.values())

    # --- services --------------------------------------------------------------------------
    async def apply_service(self, service_spec: types_pb2.ServiceSpec) -> types_pb2.Service:
        """Create the service or change it (applying the same spec again changes nothing)."""
        return await self._call(self.services.ApplyService, admission_pb2.ApplyServiceRequest(spec=service_spec))

    async def get_service(self, name: str) -> types_pb2.Service:
        return await self._call(self.services.GetService, admission_pb2.GetServiceRequest(name=name))

    async def list_services(self, team: str = "", pool: str = "") -> list[types_pb2.Service]:
        request = admission_pb2.ListServicesRequest(team=team, pool=pool)
        return list((await self._call(self.services.ListServices, request)).services)

    async def scale_service(self, name: str, replicas: int, reason: str = "") -> types_pb2.Service:
        request = admission_pb2.ScaleServiceRequest(name=name, replicas=replicas, reason=reason)
        return await self._call(self.services.ScaleService, request)

    async def rollback_service(self, name: str, revision: int = 0) -> types_pb2.Service:
        """To ``revision``, or to the previous one (0). Not retried: a retry after one that
        went through would roll back again."""
        request = admission_pb2.RollbackServiceRequest(name=name, revision=revision)
        return await self._call(self.services.RollbackService, request, retry=False)

    async def delete_service(self, name: str) -> types_pb2.Service:
        """The service as it was; not retried (a retry would answer NOT_FOUND)."""
        request = admission_pb2.DeleteServiceRequest(name=name)
        return (await self._call(self.services.DeleteService, request, retry=False)).service

    async def watch_endpoints(self, name: str) -> AsyncIterator[admission_pb2.Endpoints]:
        """WatchEndpoints: the ready list first, then again on every change; the last
        message of a deleted service says ``deleted``."""
        stream = self.services.WatchEndpoints(admission_pb2.WatchEndpointsRequest(name=name),
                                              metadata=trace_metadata())
        try:
            async for update in stream:
                yield update
        finally:
            stream.cancel()

    # --- nodes, pools, policy --------------------------------------------------------------
    async def summary(self, pool: str = "default") -> cluster_pb2.PoolSummary:
        return await self._call(self.cluster.GetPoolSummary, cluster_pb2.GetPoolSummaryRequest(pool=pool))

    async def nodes(self, pool: str = "") -> list[types_pb2.Node]:
        return list((await self._call(self.cluster.ListNodes, cluster_pb2.ListNodesRequest(pool=pool))).nodes)

    async def node(self, name: str) -> types_pb2.Node:
        return await self._call(self.cluster.GetNode, cluster_pb2.GetNodeRequest(name=name))

    async def cordon(self, name: str, reason: str = "") -> types_pb2.Node:
        return await self._call(self.cluster.CordonNode, cluster_pb2.CordonNodeRequest(name=name, reason=reason))

    async def uncordon(self, name: str) -> types_pb2.Node:
        return await self._call(self.cluster.UncordonNode, cluster_pb2.UncordonNodeRequest(name=name))

    async def create_pool(self, pool: str) -> cluster_pb2.PoolSummary:
        return await self._call(self.cluster.CreatePool, cluster_pb2.CreatePoolRequest(pool=pool))

    async def set_pool_topology(self, pool: str, levels: Sequence[str]) -> cluster_pb2.PoolSummary:
        """The pool's topology levels from the top down (node label keys, e.g. ``("spine",
        "rack", "block")``); empty: back to the default ones. Operators only."""
        request = cluster_pb2.SetPoolTopologyRequest(pool=pool, levels=list(levels))
        return await self._call(self.cluster.SetPoolTopology, request)

    async def policy(self) -> cluster_pb2.PolicyView:
        return await self._call(self.cluster.GetPolicy, cluster_pb2.GetPolicyRequest())

    async def set_quota(self, request: cluster_pb2.SetQuotaRequest) -> cluster_pb2.PolicyView:
        return await self._call(self.cluster.SetQuota, request)

    async def set_team_policy(self, request: cluster_pb2.SetTeamPolicyRequest) -> cluster_pb2.PolicyView:
        return await self._call(self.cluster.SetTeamPolicy, request)


async def _next(updates: AsyncIterator[T]) -> T:
    """``updates``' next item, as a coroutine (a task can run it)."""
    return await updates.__anext__()


def trace_metadata() -> tuple[tuple[str, str], ...] | None:
    """The current span's W3C context as gRPC metadata; None outside a span (or without
    an OpenTelemetry SDK configured: the API's no-op span injects nothing)."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return tuple(carrier.items()) or None


def new_key() -> str:
    return f"client-{uuid.uuid4()}"


class SyncClient:
    """The blocking form: the same calls as ``Client``, run on an event loop of its own
    (so it must not be used from inside a running event loop). ``with connect(...) as c:``."""

    def __init__(self, target: str = DEFAULT_ENDPOINT, tls: ClientTls | None = None, token: str = "",
                 retry: Retry = Retry()) -> None:
        self._loop = asyncio.new_event_loop()

        async def make() -> Client:   # a grpc.aio channel belongs to the loop it is made on
            return Client(target, tls, token, retry)
        self.aio = self._loop.run_until_complete(make())

    def __enter__(self) -> "SyncClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def run(self, coro) -> T:
        """Run a coroutine of ``self.aio`` (the async client) on this client's loop, to its
        end: for a tool that needs the async calls together (a watch beside a server)."""
        return self._run(coro)

    def _run(self, coro) -> T:
        """Run ``coro`` to its end. Interrupted (Ctrl-C raises KeyboardInterrupt in the
        loop's wait), it is cancelled and run until it has unwound before the interrupt
        goes on: no call is left half-way for ``close`` to trip over."""
        task = self._loop.create_task(coro)
        try:
            return self._loop.run_until_complete(task)
        except BaseException:
            if not task.done():
                task.cancel()
                self._loop.run_until_complete(asyncio.gather(task, return_exceptions=True))
            raise

    def close(self) -> None:
        """Close the channel, then end every task still on the loop (gRPC's own among
        them) and the async generators, as ``asyncio.run`` does, so that none is destroyed
        pending with the loop."""
        if self._loop.is_closed():
            return
        try:
            self._run(self.aio.close())
            left = [t for t in asyncio.all_tasks(self._loop) if not t.done()]
            for t in left:
                t.cancel()
            if left:
                self._loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())
        finally:
            self._loop.close()

    def submit(self, job_spec: types_pb2.JobSpec, key: str = "") -> admission_pb2.SubmitJobResponse:
        return self._run(self.aio.submit(job_spec, key))

    def submit_many(self, items: list[tuple[types_pb2.JobSpec, str]]) -> list[admission_pb2.SubmitJobResponse]:
        return self._run(self.aio.submit_many(items))

    def get(self, job_id: str) -> types_pb2.Job:
        return self._run(self.aio.get(job_id))

    def list_all(self, team: str = "", pool: str = "", phases: tuple[int, ...] = ()) -> list[types_pb2.Job]:
        return self._run(self.aio.list_all(team, pool, phases))

    def cancel(self, job_id: str, reason: str = "") -> types_pb2.Job:
        return self._run(self.aio.cancel(job_id, reason))

    def watch(self, team: str = "", job_id: str = "", pool: str = "") -> Iterator[admission_pb2.JobUpdate]:
        return self._follow(self.aio.watch(team, job_id, pool))

    def _follow(self, updates: AsyncIterator[T]) -> Iterator[T]:
        """An async stream of ``self.aio`` as a blocking iterator, closed when left."""
        try:
            while True:
                try:
                    yield self._run(_next(updates))
                except StopAsyncIteration:
                    return
        finally:
            if not self._loop.is_closed():
                self._run(updates.aclose())

    def wait_terminal(self, job_ids: set[str], timeout: float = 600.0) -> list[types_pb2.Job]:
        return self._run(self.aio.wait_terminal(job_ids, timeout))

    def apply_service(self, service_spec: types_pb2.ServiceSpec) -> types_pb2.Service:
        return self._run(self.aio.apply_service(service_spec))

    def get_service(self, name: str) -> types_pb2.Service:
        return self._run(self.aio.get_service(name))

    def list_services(self, team: str = "", pool: str = "") -> list[types_pb2.Service]:
        return self._run(self.aio.list_services(team, pool))

    def scale_service(self, name: str, replicas: int, reason: str = "") -> types_pb2.Service:
        return self._run(self.aio.scale_service(name, replicas, reason))

    def rollback_service(self, name: str, revision: int = 0) -> types_pb2.Service:
        return self._run(self.aio.rollback_service(name, revision))

    def delete_service(self, name: str) -> types_pb2.Service:
        return self._run(self.aio.delete_service(name))

    def watch_endpoints(self, name: str) -> Iterator[admission_pb2.Endpoints]:
        return self._follow(self.aio.watch_endpoints(name))

    def summary(self, pool: str = "default") -> cluster_pb2.PoolSummary:
        return self._run(self.aio.summary(pool))

    def nodes(self, pool: str = "") -> list[types_pb2.Node]:
        return self._run(self.aio.nodes(pool))

    def node(self, name: str) -> types_pb2.Node:
        return self._run(self.aio.node(name))

    def cordon(self, name: str, reason: str = "") -> types_pb2.Node:
        return self._run(self.aio.cordon(name, reason))

    def uncordon(self, name: str) -> types_pb2.Node:
        return self._run(self.aio.uncordon(name))

    def create_pool(self, pool: str) -> cluster_pb2.PoolSummary:
        return self._run(self.aio.create_pool(pool))

    def set_pool_topology(self, pool: str, levels: Sequence[str]) -> cluster_pb2.PoolSummary:
        return self._run(self.aio.set_pool_topology(pool, levels))

    def policy(self) -> cluster_pb2.PolicyView:
        return self._run(self.aio.policy())

    def set_quota(self, request: cluster_pb2.SetQuotaRequest) -> cluster_pb2.PolicyView:
        return self._run(self.aio.set_quota(request))

    def set_team_policy(self, request: cluster_pb2.SetTeamPolicyRequest) -> cluster_pb2.PolicyView:
        return self._run(self.aio.set_team_policy(request))


def connect(target: str = DEFAULT_ENDPOINT, tls: ClientTls | None = None, token: str = "",
            retry: Retry = Retry()) -> SyncClient:
    """A blocking client: ``with connect("127.0.0.1:50051") as c: c.submit(spec(...))``."""
    return SyncClient(target, tls, token, retry)
