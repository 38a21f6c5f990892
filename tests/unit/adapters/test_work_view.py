"""The per-node work view (gpusched.adapters.nodes.work_view) against the folded log: over
random histories (the reducer property tests' generator: attempts ending, nodes lost and
fenced, jobs placed again elsewhere), each node's view — read whole, compacted, or across a
restart of its writer — holds exactly the workers the log gives that node, with the log's
attempt and phase, and the node's latest registration; an agent that acts on it as the
node-agent does starts each worker the log placed there once, and no other."""
from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpusched.adapters.nodes.work_view import (JOB_KEY, NODE_KEY, OFFSET_HEADER, NodeView, ViewBuilder, ViewDecodeError,
                                         decode_record, job_of, work_topic)
from gpusched.core import events as ev
from gpusched.core.model import JobPhase, NodeStatus, Readiness, ServiceSpec
from gpusched.core.reducer import apply
from gpusched.core.state import ClusterState

from ..core.builders import Log, make_node, make_spec, whole
from ..core.random_histories import ACTIONS, SETTINGS, History, Rnd, cluster

RUNS = (JobPhase.PLACED, JobPhase.RUNNING)


def writer_life(events, start: int, stop: int):
    """One life of the writer, as ``WorkViewWriter`` runs it: it folds ``events[:stop]``
    from offset 0, only noting what the events below ``start`` touched (its replay), builds
    and writes their records when it goes live at ``start``, then writes each record as
    it comes. Returns the records (key, value, headers), per node, and the state."""
    state = ClusterState()
    builder = ViewBuilder()
    out = {}
    for offset, event in enumerate(events[:stop]):
        if offset == start:
            for r in builder.resync({0: state}):
                out.setdefault(r.node, []).append(r.encode())
        outcome = apply(state, event)
        if offset < start:
            builder.note(0, offset, event, outcome, state)
            continue
        for r in builder.records(0, offset, event, outcome, state):
            out.setdefault(r.node, []).append(r.encode())
    if start >= stop:
        for r in builder.resync({0: state}):
            out.setdefault(r.node, []).append(r.encode())
    return out, state


def expected_work(state: ClusterState, node: str) -> dict:
    """(job, attempt, worker) -> phase: what the log gives ``node`` to run or stop."""
    return {(j.job_id, j.attempt, w.worker): j.phase for j in state.jobs.values() if j.phase.holds_gpus
            for w in j.workers if w.node == node and w.worker not in j.finished}


def view_work(view: NodeView, node: str) -> dict:
    return expected_work(view.state, node)


def read(records) -> NodeView:
    view = NodeView()
    for key, value, headers in records:
        view.apply(key.decode(), decode_record(value, headers))
    return view


def compacted(records) -> list:
    """What a reader may find after compaction: the latest record of each key, in order,
    and no key whose latest record is a tombstone (dropped after delete.retention.ms)."""
    last = {key: i for i, (key, _, _) in enumerate(records)}
    return [r for i, r in enumerate(records) if last[r[0]] == i and r[1] is not None]


class AgentModel:
    """What the node-agent does with its view (``NodeAgent.on_view``/``_start``), live from
    its first record: on a record with ``starts`` of an attempt that runs, it starts each
    of its workers not finished and not started before (a gang's once its rendezvous is
    set); a job whose record is gone is forgotten."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.view = NodeView()
        self.launched: set[tuple] = set()
        self.starts: list[tuple] = []   # every start, doubles included

    def read(self, records) -> "AgentModel":
        for key, value, headers in records:
            doc = decode_record(value, headers)
            if not self.view.apply(key.decode(), doc) or not key.startswith(JOB_KEY.encode()):
                continue
            job_id = key.decode()[len(JOB_KEY):]
            job = self.view.state.jobs.get(job_id)
            if job is None:
                self.launched = {k for k in self.launched if k[0] != job_id}
                continue
            if doc.get("starts") and job.phase in RUNS and (job.spec.workers == 1 or job.rendezvous):
                for w in job.workers:
                    k = (job_id, job.attempt, w.worker)
                    if w.node == self.node and w.worker not in job.finished and k not in self.launched:
                        self.launched.add(k)
                        self.starts.append(k)
        return self


def placed_here(events, node: str) -> set[tuple]:
    """(job, attempt, worker) of every worker an accepted placement put on ``node``."""
    state, out = ClusterState(), set()
    for event in events:
        if apply(state, event).accepted and isinstance(event, ev.JobPlaced):
            out |= {(event.job_id, event.attempt, w.worker) for w in event.workers if w.node == node}
    return out


def startable(state: ClusterState, node: str) -> set[tuple]:
    """The workers of ``node`` an agent must have started by now: attempts that run, a
    gang's once its rendezvous is set."""
    return {(j.job_id, j.attempt, w.worker) for j in state.jobs.values()
            if j.phase in RUNS and (j.spec.workers == 1 or j.rendezvous)
            for w in j.workers if w.node == node and w.worker not in j.finished}


def registrations(events) -> dict[str, str]:
    """Each node's latest accepted registration's event id."""
    out, fresh = {}, ClusterState()
    for event in events:
        if apply(fresh, event).accepted and isinstance(event, ev.NodeRegistered):
            out[event.node.name] = event.event_id
    return out


def random_history(data) -> History:
    r = Rnd(data)
    h = History(cluster(r))
    for _ in range(r.int(5, 60)):
        r.pick(ACTIONS)(h, r)
    return h


def check_views(per_node: dict, state: ClusterState, events) -> None:
    registered = registrations(events)
    for node in state.nodes:
        records = per_node.get(node, [])
        for view in (read(records), read(compacted(records))):
            assert view_work(view, node) == expected_work(state, node)
            for job_id, job in view.state.jobs.items():
                assert job.attempt == state.jobs[job_id].attempt
                assert job.spec == state.jobs[job_id].spec
                assert job.rendezvous == state.jobs[job_id].rendezvous
            assert view.node.get("registered") == registered.get(node)
            assert view.node.get("lost", False) == (state.nodes[node].status is NodeStatus.LOST)
        placed = placed_here(events, node)
        for agent in (AgentModel(node).read(records), AgentModel(node).read(compacted(records))):
            assert len(agent.starts) == len(set(agent.starts))   # once per attempt and worker
            assert set(agent.starts) <= placed                   # only what the log placed here
            assert startable(state, node) <= agent.launched      # everything it must run
    # no view names a node that has no work or registration in the log
    assert set(per_node) <= set(state.nodes)


@SETTINGS
@given(data=st.data())
def test_each_nodes_view_holds_exactly_its_accepted_workers(data):
    h = random_history(data)
    per_node, state = writer_life(h.events, 0, len(h.events))
    check_views(per_node, state, h.events)
    for records in per_node.values():   # one life writes in log order
        offsets = [decode_record(v, h)["offset"] for _, v, h in records]
        assert offsets == sorted(offsets)


@SETTINGS
@given(data=st.data())
def test_a_writer_restart_loses_and_doubles_nothing(data):
    """A first life writes up to a random offset (and dies); the second replays everything,
    writes what it replayed, then goes on: read after both, each view is still exact, and
    what the second life rewrote is skipped by a reader that had applied it."""
    h = random_history(data)
    cut = data.draw(st.integers(0, len(h.events)))
    first, _ = writer_life(h.events, 0, cut)
    restart = data.draw(st.integers(cut, len(h.events)))
    second, state = writer_life(h.events, restart, len(h.events))
    both = {n: first.get(n, []) + second.get(n, []) for n in set(first) | set(second)}
    check_views(both, state, h.events)


def test_a_gang_record_carries_the_peers_without_their_gpus():
    log = Log(replace(make_node("a"), address="10.0.0.1"), replace(make_node("b"), address="10.0.0.2"))
    log.submit("g", workers=2, gpus=1)
    builder, state = ViewBuilder(), log.state
    out = log.place("g", ("a", whole(0)), ("b", whole(1)))
    records = builder.records(0, 7, log.events[-1], out, state)
    assert sorted(r.node for r in records) == ["a", "b"]
    rec = next(r for r in records if r.node == "a")
    job = job_of(rec.value)
    assert rec.value["starts"] and rec.value["offset"] == 7
    assert [(w.node, w.gpus) for w in job.workers] == [("a", whole(0)), ("b", ())]
    assert rec.value["addresses"] == {"a": "10.0.0.1", "b": "10.0.0.2"}
    # a record that changes nothing for the node is not written again
    assert builder.records(0, 8, log.events[-1], out, state) == []
    assert work_topic("p.", "a") == "p.work.a" and NODE_KEY == "node"


def test_a_replica_record_carries_its_service_port_and_readiness_check():
    log = Log(make_node("a"))
    readiness = Readiness(http_path="/healthz", period_s=2.0, timeout_s=0.5, initial_delay_s=3.0,
                          success_threshold=2, failure_threshold=4)
    template = replace(make_spec(), command=("serve",), serve_port=True, readiness=readiness)
    assert log(ev.ServiceApplied, spec=ServiceSpec(name="web", team="team-a", template=template, replicas=1)).accepted
    [replica] = log.state.services["web"].replicas
    builder = ViewBuilder()
    out = log.place(replica, ("a", whole(0)))
    [record] = builder.records(0, 3, log.events[-1], out, log.state)
    spec = job_of(record.value).spec
    assert (spec.service, spec.serve_port, spec.readiness) == ("web", True, readiness)


def test_a_job_record_carries_the_jobs_trace_where_the_writer_has_one():
    log = Log(make_node("a"))
    log.submit("j", gpus=1)
    out = log.place("j", ("a", whole(0)))
    traced = ViewBuilder({"j": {"traceparent": "00-ab-cd-01"}}.get).records(0, 3, log.events[-1], out, log.state)
    assert traced[0].value["trace"] == {"traceparent": "00-ab-cd-01"}
    assert "trace" not in ViewBuilder().records(0, 3, log.events[-1], out, log.state)[0].value


def by_node(records) -> dict[str, list]:
    out: dict[str, list] = {}
    for r in records:
        out.setdefault(r.node, []).append(r)
    return out


def test_a_job_placed_again_elsewhere_after_its_node_is_lost_moves_to_the_other_nodes_view():
    log = Log(make_node("a", lease=30.0, kill_wait=5.0), make_node("b"))
    builder = ViewBuilder()

    def step(out):
        return by_node(builder.records(0, len(log.events) - 1, log.events[-1], out, log.state))

    log.submit("j", gpus=1)
    first = step(log.place("j", ("a", whole(0))))
    assert first["a"][0].value["starts"] and job_of(first["a"][0].value).attempt == 0
    lost = step(log(ev.NodeLost, node="a"))
    assert [r.value["lost"] for r in lost["a"] if r.key == NODE_KEY] == [True]
    # lost, not yet fenced: the attempt ends but its worker still holds a's GPUs
    assert all(not r.gone for r in lost["a"])
    fenced = step(log(ev.NodeFenced, node="a", time=log.node("a").fence_at))
    assert [(r.key, r.gone) for r in fenced["a"]] == [("job:j", True)]
    key, value, headers = fenced["a"][0].encode()
    assert value is None and decode_record(value, headers) == {"gone": True, "offset": len(log.events) - 1}
    again = step(log.place("j", ("b", whole(1))))
    [record] = again["b"]
    assert record.value["starts"] and job_of(record.value).attempt == log.job("j").attempt >= 1
    assert "a" not in again


def test_an_attempt_that_ends_stops_then_leaves_each_view_and_a_later_record_starts_nothing():
    log = Log(make_node("a"), make_node("b"))
    builder = ViewBuilder()
    log.submit("g", workers=2, gpus=1)

    def step(out):
        return by_node(builder.records(0, len(log.events) - 1, log.events[-1], out, log.state))

    placed = step(log.place("g", ("a", whole(0)), ("b", whole(0))))
    rendezvous = step(log(ev.RendezvousSet, job_id="g", attempt=0, node="a", address="10.0.0.1", port=29500))
    assert all(r.value["starts"] for rs in (placed, rendezvous) for r in rs["a"] + rs["b"])
    assert step(log(ev.WorkerStarted, job_id="g", attempt=0, worker=1, node="b")) == {}   # nothing changed
    started = step(log(ev.WorkerStarted, job_id="g", attempt=0, worker=0, node="a"))
    # not a start event, but the log said start for this attempt and rendezvous: a reader
    # that missed the rendezvous record (compacted, or a writer died) still starts its rank
    assert [(r.value["starts"], r.value["event"]) for r in started["b"]] == [(True, "WorkerStarted")]
    assert job_of(started["b"][0].value).phase is JobPhase.RUNNING
    preempted = step(log(ev.JobPreempted, job_id="g", attempt=0, for_job="vip"))
    assert {job_of(r.value).phase for rs in preempted.values() for r in rs} == {JobPhase.PREEMPTING}
    assert all(not r.value["starts"] for rs in preempted.values() for r in rs)
    a_done = step(log.finish("g", 0, 143))
    assert [(r.node, r.gone) for rs in a_done.values() for r in rs] == [("a", True), ("b", False)]
    b_done = step(log.finish("g", 1, 143))
    assert [(r.node, r.gone) for rs in b_done.values() for r in rs] == [("b", True)]
    assert builder.start_marks == {} and builder.job_nodes == {}


def test_a_tombstone_ends_the_key_and_a_stale_record_after_it_is_skipped():
    log = Log(make_node("a"))
    builder = ViewBuilder()
    log.submit("j", gpus=1)
    out = log.place("j", ("a", whole(0)))
    live = builder.records(0, 5, log.events[-1], out, log.state)[0]
    log.start_all("j")
    out = log.finish("j", 0, 0)
    gone = builder.records(0, 9, log.events[-1], out, log.state)[0]
    view = NodeView()
    for record in (live, gone, live):   # the last: a lagging second writer's
        view.apply(record.key, decode_record(*record.encode()[1:]))
    assert view.state.jobs == {} and view.offsets["job:j"] == 9
    with pytest.raises(ViewDecodeError):
        decode_record(None, [(OFFSET_HEADER, b"x")])
    with pytest.raises(ViewDecodeError):
        decode_record(None, [])


def test_resync_builds_from_the_folded_state_what_per_event_records_would_end_with():
    """The writer's replay notes; going live it writes, per key, the records that the
    per-event builder would have ended with (same content, an offset no older)."""
    log = Log(make_node("a"), make_node("b"))
    log.submit("done", gpus=1)
    log.place("done", ("a", whole(0)))
    log.start_all("done")
    log.finish("done", 0, 0)
    log.submit("live", gpus=1)
    log.place("live", ("b", whole(0)))
    log.start_all("live")
    per_event, noting, state = ViewBuilder(), ViewBuilder(), ClusterState()
    latest = {}
    for offset, event in enumerate(log.events):
        outcome = apply(state, event)
        noting.note(0, offset, event, outcome, state)
        for r in per_event.records(0, offset, event, outcome, state):
            latest[(r.node, r.key)] = r
    resynced = {(r.node, r.key): r for r in noting.resync({0: state})}
    assert resynced.keys() == latest.keys() == {("a", NODE_KEY), ("b", NODE_KEY), ("a", "job:done"),
                                                 ("b", "job:live")}
    assert resynced[("a", "job:done")].gone
    for key, record in latest.items():
        strip = {"offset", "event"}
        assert {k: v for k, v in resynced[key].value.items() if k not in strip} == \
            {k: v for k, v in record.value.items() if k not in strip}
        assert resynced[key].value["offset"] >= record.value["offset"]
    assert noting.written == per_event.written and noting.job_nodes == per_event.job_nodes


def test_no_record_is_built_for_a_node_served_by_a_node_host():
    """A gang across a node host's node and an agent's node: only the agent's view gets
    records, and noting a replay then resyncing builds nothing for the host's node either."""
    log = Log(make_node("host-a-00000"), make_node("agent-b"))
    live, noting, state = ViewBuilder(), ViewBuilder(), ClusterState()
    for builder in (live, noting):
        builder.skip_node("host-a-00000")
    log.submit("g", workers=2, gpus=1)
    log.place("g", ("host-a-00000", whole(0)), ("agent-b", whole(0)))
    log.start_all("g")
    log.finish("g", 0, 0)
    built = []
    for offset, event in enumerate(log.events):
        outcome = apply(state, event)
        built += live.records(0, offset, event, outcome, state)
        noting.note(0, offset, event, outcome, state)
    built += noting.resync({0: state})
    assert {r.node for r in built} == {"agent-b"} and any(r.key == "job:g" for r in built)
    assert all(node != "host-a-00000" for node, _ in live.written)


def test_a_node_skipped_after_records_were_built_gets_no_tombstone_later():
    log = Log(make_node("host-a-00000"))
    builder = ViewBuilder()
    log.submit("j", gpus=1)
    out = log.place("j", ("host-a-00000", whole(0)))
    assert [r.node for r in builder.records(0, 1, log.events[-1], out, log.state)] == ["host-a-00000"]
    builder.skip_node("host-a-00000")
    assert builder.written == {}
    out = log(ev.JobCancelled, job_id="j")
    assert builder.records(0, 2, log.events[-1], out, log.state) == []
