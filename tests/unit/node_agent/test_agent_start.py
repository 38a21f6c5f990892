"""What the agent prepares for a worker it starts: a real worker gets its environment and,
alone in its job, a rendezvous port free on its node; a simulated run reads neither, so
none is built nor bound."""
from __future__ import annotations

import asyncio
from dataclasses import replace

import gpusched_node_agent.agent as agent_module
from gpusched_node_agent.agent import NodeAgent
from gpusched_node_agent.runner import ProcessRun, SimulatedRun
from tests.unit.core.builders import Log, make_node, make_spec, whole


def _started(tmp_path, monkeypatch, real_processes: bool, command: tuple[str, ...] = ()):
    """The run the agent built for worker 0 of a one-worker job placed on its node, and
    how many ports it asked for; the run itself is never started."""
    asked: list[str] = []

    def port(host: str = "127.0.0.1") -> int:
        asked.append(host)
        return 29123
    monkeypatch.setattr(agent_module, "free_port", port)
    log = Log(make_node("n1", 2))
    log.submit("j", replace(make_spec(), command=command))
    log.place("j", ("n1", whole(0)))
    job = log.job("j")

    async def start():
        agent = NodeAgent(log.node("n1").info, None, "agent-test", report_topic="reports",
                          state_dir=tmp_path, real_processes=real_processes)
        agent._start(job, job.workers[0], {"n1": "10.0.0.1"})
        task = agent.running.pop(("j", job.attempt, 0))
        task.cancel()   # before it ran: nothing is launched
        await asyncio.gather(task, return_exceptions=True)
        return agent.runs[("j", job.attempt, 0)]
    return asyncio.run(start()), asked


def test_a_simulated_run_binds_no_rendezvous_port(tmp_path, monkeypatch):
    run, asked = _started(tmp_path, monkeypatch, real_processes=False)
    assert isinstance(run, SimulatedRun)
    assert asked == []


def test_a_real_worker_gets_its_environment_and_a_free_rendezvous_port(tmp_path, monkeypatch):
    run, asked = _started(tmp_path, monkeypatch, real_processes=True, command=("true",))
    assert isinstance(run, ProcessRun)
    assert asked == [""]
    assert run.env["MASTER_PORT"] == "29123" and run.env["GPUSCHED_RDZV_ENDPOINT"].endswith(":29123")
    assert run.env["GPUSCHED_JOB_ID"] == "j" and run.env["WORLD_SIZE"] == "1"
