"""A worker the agent cannot start ends, with the reason, whatever went wrong: its end is
what frees its resources in the log (services/node-agent/agent.py). The property test
feeds the launch path real processes with arbitrary commands, environments and worker
folders, under the worker shim, and checks that every placed worker's end is reported."""
from __future__ import annotations

import asyncio
import itertools
from dataclasses import replace
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpusched_node_agent.agent import NodeAgent
from gpusched_node_agent.runner import EXIT_NOT_STARTED
from tests.unit.core.builders import Log, make_node, make_spec, whole

class Publisher:
    """Takes every report at once (the broker acknowledges at once) and keeps them."""

    def __init__(self) -> None:
        self.events: list = []

    async def send_event_to(self, topic, event, pool, extra) -> asyncio.Future:
        self.events.append(event)
        acked = asyncio.get_running_loop().create_future()
        acked.set_result(None)
        return acked

    def ends(self, key: tuple) -> list:
        return [e for e in self.events if type(e).__name__ == "WorkerFinished"
                and (e.job_id, e.attempt, e.worker) == key]


class Unstartable:
    """A run whose start raises ``error``."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    async def start(self) -> None:
        raise self.error

    async def stop(self, grace: float) -> None:
        return None


def _placed(command: tuple[str, ...] = ("true",)):
    """A one-worker job placed on n1 (its command as given, as a record written around
    admission's checks would carry it)."""
    log = Log(make_node("n1", 2))
    log.submit("j", replace(make_spec(), command=("true",)))
    log.place("j", ("n1", whole(0)))
    job = log.job("j")
    job.spec = replace(job.spec, command=command)
    return log, job


def _agent(agent_class, state_dir, log, *, real_processes: bool, grace_s: float = 0.5):
    publisher = Publisher()
    agent = agent_class(log.node("n1").info, publisher, "agent-test", report_topic="reports", state_dir=state_dir,
                        grace_s=grace_s, real_processes=real_processes)
    agent.follower = SimpleNamespace(states={0: log.state})
    agent.live = True
    return agent, publisher


async def _ended(agent: NodeAgent, key: tuple, stop_after: float = 10.0) -> None:
    """Until the worker's run is over; one still running after ``stop_after`` seconds (an
    arbitrary command may be a real program that waits) is stopped, as a cancel would."""
    task = agent.running[key]
    done, _ = await asyncio.wait({task}, timeout=stop_after)
    if not done:
        agent._stop(key)
    await asyncio.wait_for(task, 60)


ERRORS = [
    ValueError("embedded null byte"),
    UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed"),
    RuntimeError("the launcher is confused"),
    KeyError("pid"),
    TypeError("expected str, bytes or os.PathLike object, not NoneType"),
    FileNotFoundError(2, "No such file or directory", "train.py"),
]


@pytest.mark.parametrize("error", ERRORS, ids=[type(e).__name__ for e in ERRORS])
def test_a_start_that_raises_anything_reports_the_workers_end_with_the_reason(tmp_path, error):
    async def scenario():
        log, job = _placed()
        agent, publisher = _agent(NodeAgent, tmp_path, log, real_processes=True)
        key = ("j", job.attempt, 0)
        agent.launched.add(key)
        await asyncio.wait_for(agent._run(key, Unstartable(error)), 10)
        [end] = publisher.ends(key)
        assert end.exit_code == EXIT_NOT_STARTED and end.node == "n1"
        assert end.reason.startswith("cannot start: ") and str(error) in end.reason
        if not isinstance(error, OSError):
            assert type(error).__name__ in end.reason
        assert not [e for e in publisher.events if type(e).__name__ == "WorkerStarted"]
    asyncio.run(scenario())


def test_a_worker_whose_run_cannot_even_be_made_ends_with_the_reason(tmp_path):
    class Broken(NodeAgent):
        def _worker_env(self, job, worker, addresses):
            raise LookupError("no address for the gang's node")

    async def scenario():
        log, job = _placed()
        agent, publisher = _agent(Broken, tmp_path, log, real_processes=True)
        key = ("j", job.attempt, 0)
        agent._start(job, job.workers[0], {})
        await _ended(agent, key)
        [end] = publisher.ends(key)
        assert end.exit_code == EXIT_NOT_STARTED
        assert end.reason == "cannot start: LookupError: no address for the gang's node"
        assert key in agent.launched   # never started again for the same attempt
    asyncio.run(scenario())


def test_a_job_without_a_command_fails_on_a_node_that_runs_processes(tmp_path):
    """It would run nothing and "succeed"; on simulated nodes it runs its simulated duration."""
    async def scenario(real_processes: bool):
        log, job = _placed(command=())
        agent, publisher = _agent(NodeAgent, tmp_path, log, real_processes=real_processes)
        key = ("j", job.attempt, 0)
        agent._start(job, job.workers[0], {})
        await _ended(agent, key)
        [end] = publisher.ends(key)
        return end

    end = asyncio.run(scenario(real_processes=True))
    assert end.exit_code == EXIT_NOT_STARTED
    assert end.reason == ("cannot start: spec.command is empty, and n1 runs jobs as real processes: "
                          "the job would run nothing")
    assert asyncio.run(scenario(real_processes=False)).exit_code == 0


# --- the property: every placed worker ends, whatever it is asked to run, where ----------
_TEXT = st.text(st.characters(exclude_categories=()), max_size=12)   # NUL, surrogates, controls included
_PROGRAMS = st.one_of(st.sampled_from(["true", "false", "echo", "/bin/echo", "", ".", "/nonexistent/program"]),
                      _TEXT)
_COMMANDS = st.tuples(_PROGRAMS, st.lists(_TEXT, max_size=3)).map(lambda c: (c[0], *c[1]))
_ENVS = st.dictionaries(_TEXT, _TEXT, max_size=3)
# where the worker folders go: a plain folder, one under a regular file, names too long
_FOLDERS = st.tuples(st.sampled_from(["plain", "under-a-file"]),
                     st.one_of(_TEXT, st.text(min_size=256, max_size=300, alphabet="x")))
_EXAMPLES = itertools.count()


class Given(NodeAgent):
    """The agent, its workers' environment extended with the example's."""

    extra_env: dict[str, str] = {}

    def _worker_env(self, job, worker, addresses):
        return {**super()._worker_env(job, worker, addresses), **self.extra_env}


def _state_dir(base, kind: str, name: str):
    """The example's state folder below ``base``: ``name`` as folders, never above ``base``."""
    parts = [p for p in name.split("/") if p not in ("", ".", "..")] or ["w"]
    if kind == "under-a-file":
        (base / "a-file").write_text("")
        base = base / "a-file"
    return base.joinpath(*parts)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(command=_COMMANDS, env=_ENVS, folder=_FOLDERS)
def test_every_placed_worker_ends_whatever_its_command_environment_and_folder(tmp_path, command, env, folder):
    base = tmp_path / f"example-{next(_EXAMPLES)}"
    base.mkdir()
    state_dir = _state_dir(base, *folder)

    async def scenario():
        log, job = _placed(command)
        agent, publisher = _agent(Given, state_dir, log, real_processes=True, grace_s=0.3)
        agent.extra_env = env
        key = ("j", job.attempt, 0)
        agent._start(job, job.workers[0], {"n1": "127.0.0.1"})
        await _ended(agent, key)
        ends = publisher.ends(key)
        assert len(ends) == 1, (command, env, folder, publisher.events)
        if ends[0].exit_code == EXIT_NOT_STARTED:
            assert ends[0].reason, (command, env, folder)
    asyncio.run(scenario())
