"""The order and timing of a worker's reports (services/node-agent/agent.py): its end is
queued behind its start without waiting for the broker's acknowledgement of the start,
and a start whose first send failed is in before the end is sent."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

from gpusched_node_agent.agent import NodeAgent
from gpusched_node_agent.runner import WorkerExit
from tests.unit.core.builders import Log, make_node, whole


class Publisher:
    """Queues reports as the agent's publisher does; each acknowledgement is the test's to give."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, asyncio.Future]] = []

    async def send_event_to(self, topic, event, pool, extra) -> asyncio.Future:
        acked = asyncio.get_running_loop().create_future()
        self.sent.append((type(event).__name__, acked))
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
