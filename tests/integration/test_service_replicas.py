"""A service's replicas as real processes (tests/workloads/model_server.py; docs/guide/workloads.md, "Services"): each is
given a free port in PORT and told its service and replica; its node-agent checks its
readiness (an HTTP GET of /healthz) and reports it, the relay puts the report in the pool
log, and the log lists the replica's address as ready. Each endpoint answers with its own
replica's id. A replica whose worker is SIGKILLed is replaced by a new one, ready in turn,
while the other stays ready throughout."""
from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid

from gpusched.adapters.log.follower import LogFollower
from gpusched.adapters.log.publisher import DeadLetters, EventPublisher
from gpusched.core import events as ev
from gpusched.core.model import JobSpec, Readiness, ServiceSpec, WorkerResources
from gpusched.core.state import ClusterState
from gpusched.local_cluster import LocalCluster
from gpusched_node_agent.runner import STATUS_FILE, read_status
from tests.integration.service_rig import fetch, kill_workers_left, model_server



def web_service(replicas: int) -> ServiceSpec:
    template = JobSpec(name="web", team="ml", resources=WorkerResources(gpus=1),
                       command=model_server("--ready-after", "1"), max_restarts=0,
                       serve_port=True, readiness=Readiness(http_path="/healthz", period_s=0.2, failure_threshold=2))
    return ServiceSpec(name="web", team="ml", template=template, replicas=replicas)


class ReadyWatch:
    """Follows the pool log; after each event, notes the ready set of service ``web``,
    whether a replica that was ready ever left it (``left``), the readiness reports the
    log accepted and the replica jobs not ended yet (``live``)."""

    def __init__(self) -> None:
        self.ready: dict[str, str] = {}
        self.left: list[tuple[str, str]] = []    # (replica, the event after which it was no longer ready)
        self.reports: list[ev.ReplicaReadiness] = []
        self.live: set[str] = set()
        self.changed = asyncio.Event()

    def on_event(self, partition, offset, event, outcome, state: ClusterState) -> None:
        service = state.services.get("web")
        now = dict(service.ready) if service is not None else {}
        self.left += [(job, type(event).__name__) for job in self.ready if job not in now]
        if isinstance(event, ev.ReplicaReadiness) and outcome.accepted:
            self.reports.append(event)
        self.live = {j.job_id for j in state.jobs.values() if j.spec.service == "web" and not j.phase.terminal}
        self.ready = now
        self.changed.set()

    async def until(self, predicate, what: str, timeout: float = 90.0) -> dict[str, str]:
        """The ready set once ``predicate(self)`` holds."""
        async def wait() -> dict[str, str]:
            while not predicate(self):
                self.changed.clear()
                await self.changed.wait()
            return dict(self.ready)
        try:
            return await asyncio.wait_for(wait(), timeout)
        except asyncio.TimeoutError:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}; ready: {self.ready}") from None


async def test_replicas_serve_on_their_port_are_reported_ready_and_a_killed_one_is_replaced(
        kafka_bootstrap, topics, tmp_path):
    cluster = LocalCluster(kafka_bootstrap, topics, tmp_path / "logs")
    publisher = EventPublisher(kafka_bootstrap, topics, 4)
    watch = ReadyWatch()
    follower = LogFollower(kafka_bootstrap, topics, f"test-{uuid.uuid4().hex[:6]}", DeadLetters(None, "test"),
                           on_event=watch.on_event)
    state_dir = tmp_path / "node-0"
    try:
        await publisher.start()
        await follower.start()
        await cluster.admission()
        await cluster.placer()
        agent_args = ("node-0", "4xH100-80GB", "--run-processes", "--state-dir", str(state_dir),
                      "--address", "127.0.0.1", "--grace", "1", "--lease", "20")
        agent = await cluster.agent(*agent_args)
        await publisher.publish(ev.ServiceApplied(event_id=uuid.uuid4().hex, time=time.time(), producer="test",
                                                  spec=web_service(2)), "default")

        ready = await watch.until(lambda w: len(w.ready) == 2, "both replicas ready")
        assert {endpoint.rpartition(":")[0] for endpoint in ready.values()} == {"127.0.0.1"}   # the node's address
        assert len(set(ready.values())) == 2                                                 # a port each
        for replica, endpoint in ready.items():
            assert await fetch(endpoint) == f"{replica} v1\n"
            assert await fetch(endpoint, "/healthz") == "ok\n"
        # reported by the check of /healthz, on the port each replica serves on
        assert len(watch.reports) == 2
        assert {(r.job_id, f"{r.address}:{r.port}", r.ready, r.reason) for r in watch.reports} == \
            {(job, endpoint, True, "http 200") for job, endpoint in ready.items()}

        # The agent restarts: it adopts the running workers and checks them again on the
        # port each kept, reporting each ready again at the same endpoint.
        await agent.terminate()
        await cluster.agent(*agent_args)
        await watch.until(lambda w: len(w.reports) == 4, "the restarted agent's reports")
        assert {(r.job_id, f"{r.address}:{r.port}", r.ready) for r in watch.reports[2:]} == \
            {(job, endpoint, True) for job, endpoint in ready.items()}
        assert watch.ready == ready and watch.left == []
        for replica, endpoint in ready.items():
            assert await fetch(endpoint) == f"{replica} v1\n"

        victim, survivor = sorted(ready)
        status = read_status(next(state_dir.glob(f"{victim}-*-0")) / STATUS_FILE)
        os.kill(status["pid"], signal.SIGKILL)
        after = await watch.until(lambda w: victim not in w.ready and len(w.ready) == 2,
                                  "a new replica in the victim's place")
        [new] = set(after) - {survivor}
        assert new not in ready and after[survivor] == ready[survivor]
        assert await fetch(after[new]) == f"{new} v1\n"
        assert watch.left == [(victim, "WorkerFinished")]   # the survivor never left the ready set

        # deleted: every replica is stopped (its worker too), and none is reported not ready
        await publisher.publish(ev.ServiceDeleted(event_id=uuid.uuid4().hex, time=time.time(), producer="test",
                                                  service="web"), "default")
        await watch.until(lambda w: not w.live and not w.ready, "every replica ended")
        assert not [r for r in watch.reports if not r.ready]
    finally:
        kill_workers_left(state_dir)
        await cluster.stop_all()
        await follower.stop()
        await publisher.stop()
