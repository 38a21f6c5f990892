"""A leftover worker that outlives SIGKILL (a process in uninterruptible sleep) still uses
its GPUs: the restarted agent must not report it ended, so the log keeps its GPUs held,
and it cordons its node. Only the kernel makes such a process, so the agent's liveness
probe (``NodeAgent.process_alive``) stands in for it on one real process; everything
else is real: the leftover processes, the agent's join, its reports checked as the relay
checks them and folded by the reducer."""
from __future__ import annotations

import asyncio
import json
import subprocess

import pytest

from gpusched.adapters.nodes.reports import check_report
from gpusched.core import events as ev
from gpusched.core.reducer import apply
from gpusched.core.model import JobPhase
from gpusched_node_agent import leftovers
from gpusched_node_agent.agent import NodeAgent, note_in_log
from gpusched_node_agent.leftovers import worker_dir_name
from gpusched_node_agent.runner import group_alive
from gpusched_node_agent.proc_info import boot_id
from tests.unit.core.builders import Log, make_node, make_spec, whole, workers
from tests.unit.node_agent.procs import pid_alive

KILL_WAIT = 0.2
NODE = "node-0"


class _Follower:
    """The pool log as the agent reads it: one folded state, caught up."""

    def __init__(self, log: Log) -> None:
        self.states = {0: log.state}

    async def caught_up(self) -> None:
        return None


class _RelayedAgent(NodeAgent):
    """The agent with its report topic replaced by what the relay does with a report:
    ``check_report``, then the fold, then the agent hears its event back."""

    def __init__(self, log: Log, state_dir, stuck_pid: int) -> None:
        super().__init__(log.state.nodes[NODE].info, None, "agent-test", report_topic="unused", state_dir=state_dir,
                         grace_s=KILL_WAIT, real_processes=True)
        self.log, self.refused = log, []
        # this one process "outlives SIGKILL"; every other is judged as it really is
        self.process_alive = lambda pgid: pgid == stuck_pid or group_alive(pgid)

    async def _send_report(self, event) -> None:
        why = check_report(NODE, "default", event, self.log.state)
        if why:
            self.refused.append(why)
            return
        self.log.events.append(event)
        outcome = apply(self.log.state, event)
        self.on_event(0, len(self.log.events), event, outcome, self.log.state)
        note_in_log(self._in_log, event, self.log.state)

    async def beat(self) -> bool:
        return True


def _leftover(state_dir, job_id: str) -> subprocess.Popen:
    """A workload an earlier agent left running, its shim gone: a real process."""
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    folder = state_dir / worker_dir_name(job_id, 0, 0)
    folder.mkdir(parents=True)
    (folder / "shim.json").write_text(json.dumps({"shim_pid": None, "pid": proc.pid, "boot_id": boot_id(),
                                                  "started_at": 1.0}))
    return proc


@pytest.fixture
def log() -> Log:
    log = Log(make_node(NODE, gpus=2, lease=5.0, kill_wait=KILL_WAIT))
    for i, job_id in enumerate(("stuck", "fine")):
        assert log(ev.JobSubmitted, job_id=job_id, spec=make_spec(name=job_id)).accepted
        assert log(ev.JobPlaced, job_id=job_id, attempt=0, workers=workers((NODE, whole(i)))).accepted
        assert log(ev.WorkerStarted, job_id=job_id, attempt=0, worker=0, node=NODE).accepted
    return log


def _finished(log: Log, job_id: str) -> list[ev.WorkerFinished]:
    return [e for e in log.events if isinstance(e, ev.WorkerFinished) and e.job_id == job_id]


async def test_a_leftover_that_outlives_sigkill_keeps_its_gpus_and_cordons_the_node(log, tmp_path, monkeypatch):
    monkeypatch.setattr(leftovers, "MARGIN_S", 0.3)
    stuck, fine = _leftover(tmp_path, "stuck"), _leftover(tmp_path, "fine")
    try:
        agent = _RelayedAgent(log, tmp_path, stuck.pid)
        await agent.join(_Follower(log))
        assert agent.refused == []

        # the one that ended is reported so, and its GPU freed
        assert [e.signal for e in _finished(log, "fine")] == [15] and not pid_alive(fine.pid)
        assert not log.state.jobs["fine"].phase.holds_gpus
        # the one still there is not: its job holds GPU 0, and the node takes no new work
        assert _finished(log, "stuck") == []
        node = log.state.nodes[NODE]
        assert log.state.jobs["stuck"].phase is JobPhase.RUNNING and node.jobs == {"stuck"}
        assert node.cordoned and not node.schedulable
        [cordon] = [e for e in log.events if isinstance(e, ev.NodeCordoned)]
        assert "stuck-0-0" in cordon.reason and "after SIGKILL" in cordon.reason

        # cancelled now, the job is stopping: the agent still reports no end for it
        outcome = log(ev.JobCancelled, job_id="stuck")
        agent.on_event(0, len(log.events), log.events[-1], outcome, log.state)
        await asyncio.sleep(0.05)   # tasks the agent started for the event (none may report)
        assert _finished(log, "stuck") == [] and log.state.jobs["stuck"].phase is JobPhase.STOPPING
        # ... and never starts it again
        assert ("stuck", 0, 0) not in agent.running
    finally:
        for proc in (stuck, fine):
            proc.kill()
            proc.wait()
