"""The node-agent's usage reporter, against a stand-in agent: which workers it reports,
their windows, and the records it puts on the usage topic."""
from __future__ import annotations

import argparse
import asyncio
from types import SimpleNamespace

import pytest

from gpusched.adapters.gpus.gpu_usage import SimulatedSampler, UsageRule
from gpusched.adapters.broker.kafka_admin import TopicNames
from gpusched.adapters.nodes.reports import KIND_HEADER, USAGE_KIND
from gpusched.adapters.nodes.usage_records import decode_usage
from gpusched.config import NodeAgentSettings, SettingsError
from gpusched.core.model import JobKind
from gpusched_node_agent.usage import report_usage, running_workers, usage_records, usage_rules
from tests.unit.core.builders import Log, make_node, make_spec, share, whole

NODE = make_node("n1", gpus=4)


class Publisher:
    """Collects what is sent; ``got`` is set once ``want`` records arrived."""

    def __init__(self, want: int) -> None:
        self.topics = TopicNames("t.")
        self.sent: list[tuple[str, bytes, bytes]] = []
        self.headers: list = []
        self.want = want
        self.got = asyncio.Event()

    async def send_raw(self, topic, value, key=None, partition=None, headers=None):
        self.sent.append((topic, value, key))
        self.headers.append(headers)
        if len(self.sent) >= self.want:
            self.got.set()


def _agent(publisher=None):
    log = Log(NODE, make_node("n2", gpus=2))
    log.submit("train", make_spec(gpus=2, name="train-1"))
    log.run("train", ("n1", whole(0, 1)))
    log.submit("gang", make_spec(workers=2, gpus=1, name="gang-1"))
    log.run("gang", ("n2", whole(0)), ("n1", whole(2)))            # worker 1 is ours
    log.submit("inf", make_spec(milli=250, name="inf-1"))
    log.run("inf", ("n1", share(3, 250)))
    running = {("train", 0, 0): None, ("gang", 0, 1): None, ("inf", 0, 0): None,
               ("gone", 0, 0): None,                                # not in the log (any more)
               ("train", 7, 0): None}                               # an old attempt
    return SimpleNamespace(info=NODE, name="n1", running=running, runs={}, publisher=publisher,
                           report_topic="t.reports.n1",
                           follower=SimpleNamespace(states={0: log.state}))


def test_running_workers_are_the_ones_the_log_assigns_here_with_their_gpus():
    workers = {w.key: w for w in running_workers(_agent())}
    assert set(workers) == {("train", 0, 0), ("gang", 0, 1), ("inf", 0, 0)}
    assert [s.index for s in workers[("train", 0, 0)].gpus] == [0, 1]
    assert [s.index for s in workers[("gang", 0, 1)].gpus] == [2]
    assert workers[("inf", 0, 0)].gpus[0].milli == 250
    assert workers[("train", 0, 0)].name == "train-1"
    assert workers[("train", 0, 0)].kind == JobKind.TRAINING.value


def test_windows_run_from_the_previous_sample_and_forget_ended_workers():
    workers = running_workers(_agent())
    sampler = SimulatedSampler(NODE.gpus, seed=3)
    last: dict = {}
    first = usage_records(NODE, workers, sampler.read(workers), last, 1000.0, 5.0, True)
    assert {r.window_s for r in first} == {5.0}
    second = usage_records(NODE, workers[:1], sampler.read(workers[:1]), last, 1004.0, 5.0, True)
    assert [(r.key, r.window_s, r.time) for r in second] == [(workers[0].key, 4.0, 1004.0)]
    assert set(last) == {workers[0].key}
    assert len({r.record_id for r in first + second}) == len(first) + 1


async def test_the_reporter_publishes_one_record_per_worker_keyed_by_node_until_stopped():
    publisher = Publisher(want=6)   # two rounds of three workers
    agent = _agent(publisher)
    sampler = SimulatedSampler(NODE.gpus, rules=(UsageRule("inf-*", 0),))
    stop = asyncio.Event()
    task = asyncio.create_task(report_usage(agent, sampler, 0.05, stop))
    await asyncio.wait_for(publisher.got.wait(), 10)
    stop.set()
    await asyncio.wait_for(task, 10)
    records = [decode_usage(v) for _, v, _ in publisher.sent]
    assert {t for t, _, _ in publisher.sent} == {"t.reports.n1"}   # the node's own topic,
    assert all(h == [(KIND_HEADER, USAGE_KIND)] for h in publisher.headers)   # marked for the relay
    assert {k for _, _, k in publisher.sent} == {b"n1"}
    assert {r.key for r in records[:6]} == {("train", 0, 0), ("gang", 0, 1), ("inf", 0, 0)}
    assert all(r.simulated and r.node == "n1" and r.pool == "default" for r in records)
    inf = [r for r in records if r.job_id == "inf"]
    assert all(g.sm_percent == 0.0 and g.milli == 250 for r in inf for g in r.gpus)


async def test_a_failing_sample_does_not_end_the_reporting():
    publisher = Publisher(want=1)
    agent = _agent(publisher)

    class Flaky(SimulatedSampler):
        calls = 0

        def read(self, workers):
            self.calls += 1
            if self.calls == 1:
                raise RuntimeError("NVML hiccup")
            return super().read(workers)
    stop = asyncio.Event()
    task = asyncio.create_task(report_usage(agent, Flaky(NODE.gpus), 0.02, stop))
    await asyncio.wait_for(publisher.got.wait(), 10)
    stop.set()
    await asyncio.wait_for(task, 10)


def _settings(argv: list[str]) -> NodeAgentSettings:
    parser = argparse.ArgumentParser()
    NodeAgentSettings.add_args(parser, {})
    return NodeAgentSettings.from_args(parser.parse_args(argv), {})


@pytest.mark.parametrize("argv, message", [
    (["--usage-interval", "-1"], "--usage-interval: "),
    (["--usage-interval", "nan"], "--usage-interval: "),
])
def test_bad_usage_intervals_are_refused_naming_the_flag(argv, message):
    with pytest.raises(SettingsError, match=message):
        _settings(argv)


def test_a_bad_usage_rule_stops_the_agent_naming_the_flag():
    with pytest.raises(SystemExit, match="invalid settings: --simulated-usage: 'idle\\*' is not PATTERN=PERCENT"):
        usage_rules(_settings(["--simulated-usage", "nb-*=3", "--simulated-usage", "idle*"]))


def test_flags_parse():
    own = _settings(["--usage-interval", "0", "--simulated-usage", "nb-*=3"])
    assert own.usage_interval == 0 and usage_rules(own) == (UsageRule("nb-*", 3.0),)
    assert _settings([]).usage_interval == 5.0 and usage_rules(_settings([])) == ()


async def test_a_sampler_that_cannot_start_ends_the_reporter_not_the_agent(caplog):
    class Broken(SimulatedSampler):
        def start(self):
            raise OSError("NVML: driver not loaded")
    await asyncio.wait_for(report_usage(_agent(Publisher(want=1)), Broken(NODE.gpus), 0.01, asyncio.Event()), 10)
    assert "usage sampling unavailable" in caplog.text


async def test_each_sample_sets_the_nodes_gpus_used_for_its_metrics():
    from gpusched.adapters.telemetry import metrics
    from gpusched_node_agent.usage import publish_usage
    agent = _agent(Publisher(want=3))
    sampler = SimulatedSampler(NODE.gpus, rules=(UsageRule("train-*", 50), UsageRule("gang-*", 100),
                                                 UsageRule("inf-*", 0)))
    records = await publish_usage(agent, sampler, {}, 5.0)
    assert len(records) == 3
    assert metrics._gpus_used[("default", "n1")] == pytest.approx(2 * 0.5 + 1.0)   # 2 GPUs half busy, 1 whole
