"""The order and timing of a worker's reports (services/node-agent/agent.py): its end is
queued behind its start without waiting for the broker's acknowledgement of the start,
and a start whose first send failed is in before the end is sent. A replica's readiness
is reported by its worker 0 after its start, and its check stops with the worker."""
from __future__ import annotations

import asyncio
from dataclasses import replace
from types import SimpleNamespace

from gpusched.core import events as ev
from gpusched.core.model import Readiness, ServiceSpec
from gpusched_node_agent.agent import NodeAgent
from gpusched_node_agent.runner import WorkerExit
from tests.unit.core.builders import Log, make_node, make_spec, whole


class Publisher:
    """Queues reports as the agent's publisher does; each acknowledgement is the test's to give."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, asyncio.Future]] = []
        self.events: list = []

    async def send_event_to(self, topic, event, pool, extra) -> asyncio.Future:
        acked = asyncio.get_running_loop().create_future()
        self.sent.append((type(event).__name__, acked))
        self.events.append(event)
        return acked

    def kinds(self) -> list[str]:
        return [kind for kind, _ in self.sent]


class Run:
    """A worker that starts at once and ends when the test says."""

    def __init__(self) -> None:
        self.end = asyncio.Event()

    async def start(self) -> None:
        return None

    async def wait(self) -> WorkerExit:
        await self.end.wait()
        return WorkerExit(0)


async def _settle() -> None:
    """Let every task that can go on do so (nothing here waits on a clock)."""
    for _ in range(50):
        await asyncio.sleep(0)


def _agent(tmp_path, publisher: Publisher) -> tuple[NodeAgent, tuple]:
    log = Log(make_node("n1", 2))
    log.submit("j")
    log.place("j", ("n1", whole(0)))
    agent = NodeAgent(log.node("n1").info, publisher, "agent-test", report_topic="reports", state_dir=tmp_path)
    agent.follower = SimpleNamespace(states={0: log.state})
    return agent, ("j", log.job("j").attempt, 0)


def test_the_end_is_queued_behind_the_start_before_the_start_is_acknowledged(tmp_path):
    async def scenario():
        publisher, run = Publisher(), Run()
        agent, key = _agent(tmp_path, publisher)
        task = asyncio.create_task(agent._run(key, run))
        await _settle()
        assert publisher.kinds() == ["WorkerStarted"]
        run.end.set()
        await _settle()
        assert publisher.kinds() == ["WorkerStarted", "WorkerFinished"]
        assert not publisher.sent[0][1].done()   # the start is not acknowledged yet
        assert not task.done()                   # nor is the run's report over before both are
        for _, acked in publisher.sent:
            acked.set_result(None)
        await asyncio.wait_for(task, 5)
    asyncio.run(scenario())


def test_a_start_whose_send_failed_is_in_before_the_end_goes(tmp_path):
    async def scenario():
        publisher, run = Publisher(), Run()
        agent, key = _agent(tmp_path, publisher)
        task = asyncio.create_task(agent._run(key, run))
        await _settle()
        publisher.sent[0][1].set_exception(ConnectionError("broker gone"))
        await _settle()
        assert publisher.kinds() == ["WorkerStarted", "WorkerStarted"]   # sent again
        run.end.set()
        await _settle()
        assert publisher.kinds() == ["WorkerStarted", "WorkerStarted"]   # the end waits for it
        publisher.sent[1][1].set_result(None)
        await _settle()
        assert publisher.kinds() == ["WorkerStarted", "WorkerStarted", "WorkerFinished"]
        publisher.sent[2][1].set_result(None)
        await asyncio.wait_for(task, 5)
    asyncio.run(scenario())


def _replica_agent(tmp_path, publisher: Publisher, workers: int = 1) -> tuple[NodeAgent, str, Log]:
    """Replica of service web, its workers placed on n1 (``workers`` of them), on a
    simulated node (no process: no check to run)."""
    log = Log(make_node("n1", 2))
    template = replace(make_spec(workers=workers), serve_port=True, readiness=Readiness(http_path="/healthz"))
    log(ev.ServiceApplied, spec=ServiceSpec(name="web", team="team-a", template=template, replicas=1))
    [replica] = log.state.services["web"].replicas
    log.place(replica, *(("n1", whole(i)) for i in range(workers)))
    agent = NodeAgent(replace(log.node("n1").info, address="10.0.0.7"), publisher, "agent-test",
                      report_topic="reports", state_dir=tmp_path)
    agent.follower = SimpleNamespace(states={0: log.state})
    return agent, replica, log


def test_worker_0_of_a_replica_is_reported_ready_after_its_start_and_no_other_worker_is(tmp_path):
    async def scenario():
        publisher = Publisher()
        agent, replica, log = _replica_agent(tmp_path, publisher, workers=2)
        attempt = log.job(replica).attempt
        runs = [Run(), Run()]
        tasks = [asyncio.create_task(agent._run((replica, attempt, w), runs[w])) for w in (0, 1)]
        await _settle()
        assert sorted(publisher.kinds()) == ["ReplicaReadiness", "WorkerStarted", "WorkerStarted"]
        [ready] = [e for e in publisher.events if isinstance(e, ev.ReplicaReadiness)]
        assert (ready.job_id, ready.attempt, ready.ready, ready.address, ready.port) == \
            (replica, attempt, True, "10.0.0.7", 0)
        assert publisher.kinds().index("ReplicaReadiness") > publisher.kinds().index("WorkerStarted")
        for acked in (a for _, a in publisher.sent):
            acked.set_result(None)
        await _settle()
        assert [t.done() for t in agent.checks.values()] == [True]   # no check to run: its work is done
        for run in runs:
            run.end.set()
        await _settle()
        for _, acked in publisher.sent:
            if not acked.done():
                acked.set_result(None)
        await asyncio.wait_for(asyncio.gather(*tasks), 5)
        assert publisher.kinds().count("ReplicaReadiness") == 1
    asyncio.run(scenario())


def test_a_replicas_check_stops_when_its_worker_is_stopped(tmp_path):
    async def scenario():
        publisher = Publisher()
        agent, replica, log = _replica_agent(tmp_path, publisher)
        agent.real_processes = True   # the check is one of a real process: it runs until stopped
        key = (replica, log.job(replica).attempt, 0)
        run = Run()
        agent.runs[key] = run
        task = asyncio.create_task(agent._run(key, run))
        await _settle()
        check = agent.checks[key]
        assert not check.done()
        run.stop = lambda grace: run.end.set() or asyncio.sleep(0)
        agent._stop(key)
        await _settle()
        assert check.cancelled() and key not in agent.checks
        for _, acked in publisher.sent:
            if not acked.done():
                acked.set_result(None)
        await asyncio.wait_for(task, 5)
        assert "ReplicaReadiness" not in publisher.kinds()
    asyncio.run(scenario())
