"""What the relay lets into the pool log from a node's report topic (gpusched.adapters.nodes.reports):
the kinds of event an agent emits, about that node's own work. Pure: no broker."""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpusched.adapters.nodes.reports import (AGENT_KINDS, BEATS, beats_topic, check_node_name, check_report, node_of_topic,
                                       node_principal, report_pattern, report_topic)
from gpusched.core import events as ev
from gpusched.core.model import EXIT_LOST
from tests.unit.core.builders import Log, make_node, whole


@pytest.fixture
def log() -> Log:
    """Job j1 (attempt 0) runs worker 0 on n1 and worker 1 on n2; n1, n2 in pool default."""
    log = Log(make_node("n1"), make_node("n2"))
    assert log.submit("j1", workers=2).accepted
    log.run("j1", ("n1", whole(0)), ("n2", whole(0)))
    return log


def _e(cls, **kw):
    return cls(event_id="r1", time=1.0, producer="node-agent-n1", **kw)


def test_an_agents_own_events_pass(log):
    state = log.state
    own = [
        _e(ev.NodeRegistered, node=make_node("n1")),
        _e(ev.GpuHealthChanged, node="n1", gpu_index=0, healthy=False),
        _e(ev.NodeCordoned, node="n1", reason="a worker outlived SIGKILL"),
        _e(ev.WorkerStarted, job_id="j1", attempt=0, worker=0, node="n1"),
        _e(ev.WorkerFinished, job_id="j1", attempt=0, worker=0, node="n1", exit_code=0),
        _e(ev.RendezvousSet, job_id="j1", attempt=0, node="n1", address="10.0.0.1", port=2000),
        _e(ev.CheckpointSaved, job_id="j1", attempt=0, checkpoint="s3://c"),
        _e(ev.AttemptFailed, job_id="j1", attempt=0, reason="hung"),
        _e(ev.ReplicaReadiness, job_id="j1", attempt=0, ready=True, address="10.0.0.1", port=8000, reason="http 200"),
    ]
    assert [check_report("n1", "default", e, state) for e in own] == [""] * len(own)


def test_a_registration_of_another_node_or_pool_is_refused(log):
    assert "NodeRegistered of node 'n2'" in check_report("n1", "default", _e(ev.NodeRegistered, node=make_node("n2")),
                                                         log.state)
    moved = _e(ev.NodeRegistered, node=make_node("n1", pool="other"))
    assert "pool 'other' sent to the log of pool 'default'" in check_report("n1", "default", moved, log.state)


@pytest.mark.parametrize("event, why", [
    (_e(ev.JobSubmitted, job_id="x", spec=None), "JobSubmitted is not an event a node-agent reports"),
    (_e(ev.JobPlaced, job_id="j1", attempt=0, workers=()), "JobPlaced is not an event a node-agent reports"),
    (_e(ev.NodeCordoned, node="n2"), "NodeCordoned of node 'n2' reported by node 'n1'"),
    (_e(ev.NodeUncordoned, node="n1"), "NodeUncordoned is not an event a node-agent reports"),
    (_e(ev.NodeLost, node="n2"), "NodeLost is not an event a node-agent reports"),
    (_e(ev.GpuHealthChanged, node="n2", gpu_index=0, healthy=False), "GpuHealthChanged of node 'n2'"),
    (_e(ev.WorkerFinished, job_id="j1", attempt=0, worker=1, node="n2", exit_code=EXIT_LOST),
     "WorkerFinished about node 'n2' reported by node 'n1'"),
    # naming itself, about a worker placed elsewhere
    (_e(ev.WorkerFinished, job_id="j1", attempt=0, worker=1, node="n1", exit_code=0),
     "worker 1 of job 'j1' attempt 0 is not placed on node 'n1'"),
    (_e(ev.WorkerStarted, job_id="j1", attempt=3, worker=0, node="n1"), "attempt 3 of job 'j1', which is at attempt 0"),
    (_e(ev.WorkerStarted, job_id="nope", attempt=0, worker=0, node="n1"), "job 'nope', which is not in this pool"),
])
def test_what_an_agent_does_not_own_is_refused_with_the_reason(log, event, why):
    assert why in check_report("n1", "default", event, log.state)


def test_a_node_without_work_of_the_job_may_not_checkpoint_fail_or_meet_it(log):
    log(ev.NodeRegistered, node=make_node("n3"))
    for event in (_e(ev.CheckpointSaved, job_id="j1", attempt=0, checkpoint="c"),
                  _e(ev.AttemptFailed, job_id="j1", attempt=0),
                  _e(ev.RendezvousSet, job_id="j1", attempt=0, node="n3", address="a", port=1)):
        assert "is not placed on node 'n3'" in check_report("n3", "default", event, log.state)
    # worker 0 is n1's: n2 may not set the gang's rendezvous
    assert "worker 0 of job 'j1'" in check_report(
        "n2", "default", _e(ev.RendezvousSet, job_id="j1", attempt=0, node="n2", address="a", port=1), log.state)


def test_an_unregistered_node_or_another_pool_reports_nothing_but_its_registration(log):
    start = _e(ev.WorkerStarted, job_id="j1", attempt=0, worker=0, node="n1")
    assert "node 'n9' is not registered in pool 'default'" in check_report(
        "n9", "default", _e(ev.GpuHealthChanged, node="n9", gpu_index=0, healthy=False), log.state)
    assert "node 'n1' is not registered in pool 'gpu-b'" in check_report("n1", "gpu-b", start, log.state)


@given(st.sampled_from(sorted(ev.EVENT_TYPES)))
def test_only_agent_kinds_can_pass(name):
    cls = ev.EVENT_TYPES[name]
    if cls in AGENT_KINDS:
        return
    event = object.__new__(cls)   # the kind alone decides, before any field is read
    assert check_report("n1", "default", event, Log(make_node("n1")).state).endswith("is not an event a node-agent reports")


def test_names():
    assert report_topic("gpusched.", "node-7") == "gpusched.reports.node-7"
    assert node_of_topic("gpusched.", "gpusched.reports.node-7") == "node-7"
    assert node_of_topic("gpusched.", "other.reports.node-7") == ""
    assert node_principal("a.b_c-1") == "node-agent.a.b_c-1"
    import re
    assert re.match(report_pattern("t-x."), "t-x.reports.n1") and not re.match(report_pattern("t-x."), "t-xy.reports.n1")
    for bad in ("", ".hidden", "a/b", "a b", "x" * 201, "é"):
        with pytest.raises(ValueError, match="node name"):
            check_node_name(bad)


def test_the_relay_appends_skips_what_the_log_has_and_refuses_the_rest(log):
    from gpusched.adapters.log import codec
    from gpusched.adapters.log.publisher import partition_for
    from gpusched.adapters.nodes.relay import triage

    states = {partition_for("default", 4): log.state}
    start = _e(ev.WorkerStarted, job_id="j1", attempt=0, worker=0, node="n1")
    verdict = triage("n1", codec.encode(start, "default"), states, 4)
    assert (verdict.event, verdict.pool, verdict.reason, verdict.seen) == (start, "default", "", False)
    # once its id is folded (a relay restarted before its commit reads it again): skipped
    log.replay(start)
    assert triage("n1", codec.encode(start, "default"), states, 4).seen
    theirs = ev.WorkerStarted(event_id="r2", job_id="j1", attempt=0, worker=0, node="n1")
    assert triage("n2", codec.encode(theirs, "default"), states, 4).reason == \
        "refused: WorkerStarted about node 'n1' reported by node 'n2'"
    assert triage("n1", b"\xff garbage", states, 4).reason.startswith("does not decode")
    other = next(p for p in ("a", "b", "c", "d", "e") if partition_for(p, 4) not in states)
    assert "whose log this relay does not follow" in triage("n1", codec.encode(start, other), states, 4).reason


def test_the_relay_takes_a_replicas_readiness_only_from_the_node_of_its_worker_0(log):
    from gpusched.adapters.log import codec
    from gpusched.adapters.log.publisher import partition_for
    from gpusched.adapters.nodes.relay import triage

    states = {partition_for("default", 4): log.state}
    ready = _e(ev.ReplicaReadiness, job_id="j1", attempt=0, ready=True, address="10.0.0.1", port=8000,
               reason="http 200")
    passed = triage("n1", codec.encode(ready, "default"), states, 4)
    assert (passed.event, passed.pool, passed.reason) == (ready, "default", "")
    # n2 runs worker 1 of the attempt, not worker 0: it does not serve the replica's endpoint
    assert triage("n2", codec.encode(ready, "default"), states, 4).reason == \
        "refused: ReplicaReadiness: worker 0 of job 'j1' attempt 0 is not placed on node 'n2'"
    stale = dataclasses.replace(ready, attempt=1)
    assert triage("n1", codec.encode(stale, "default"), states, 4).reason == \
        "refused: ReplicaReadiness of attempt 1 of job 'j1', which is at attempt 0"


def test_a_usage_record_passes_only_on_its_own_nodes_topic():
    from gpusched.adapters.nodes.relay import usage_refusal
    from gpusched.adapters.nodes.usage_records import WorkerUsage, encode_usage

    record = encode_usage(WorkerUsage(record_id="u1", node="n1", pool="default", job_id="j1", attempt=0,
                                      worker=0, time=1.0, window_s=1.0))
    assert usage_refusal("n1", record) == ""
    assert usage_refusal("n2", record) == "refused: usage record of node 'n1' reported by node 'n2'"
    assert usage_refusal("n1", b"\xff garbage").startswith("does not decode")


def test_beats_topics_name_their_node():
    assert beats_topic("gpusched.", "node-7") == "gpusched.beats.node-7"
    assert node_of_topic("gpusched.", "gpusched.beats.node-7", BEATS) == "node-7"
    assert node_of_topic("gpusched.", "gpusched.reports.node-7", BEATS) == ""
    with pytest.raises(ValueError, match="node name"):
        beats_topic("gpusched.", "a/b")


def test_a_host_speaks_only_for_the_nodes_named_after_it():
    from gpusched.adapters.nodes.reports import (NODE_HEADER, host_beats_topic, host_report_topic, hosted_by, hosted_node,
                                           hosted_node_name)
    import re
    assert hosted_node_name("h1", 7) == "h1-00007"
    assert host_report_topic("g.", "h1") == "g.hostreports.h1" and host_beats_topic("g.", "h1") == "g.hostbeats.h1"
    assert re.match(report_pattern("g."), "g.hostreports.h1") and not re.match(report_pattern("g."), "g.hostbeats.h1")
    assert hosted_by("h1", "h1-00007") and hosted_by("h1", "h1-x")
    for other in ("h1", "h1-", "h10-00001", "n1", "h2-00001", "h1-a/b"):
        assert not hosted_by("h1", other), other
    assert hosted_node("h1", [(NODE_HEADER, b"h1-00003")]) == ("h1-00003", "")
    node, why = hosted_node("h1", [(NODE_HEADER, b"n1")])
    assert node == "" and "which host 'h1' does not host" in why
    assert hosted_node("h1", None)[1]   # no header: refused, not taken as the host itself

