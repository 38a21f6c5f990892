"""The per-node work view (gpusched.adapters.work_view) against the folded log: over
random histories (the reducer property tests' generator), each node's view — read whole,
compacted, or across a restart of its writer — holds exactly the workers the log gives
that node, with the log's attempt and phase, and the node's latest registration."""
from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from gpusched.adapters.work_view import NODE_KEY, NodeView, ViewBuilder, decode_value, job_of, work_topic
from gpusched.core import events as ev
from gpusched.core.model import NodeStatus
from gpusched.core.reducer import apply
from gpusched.core.state import ClusterState

from ..core.builders import Log, make_node, whole
from ..core.test_core_properties import ACTIONS, SETTINGS, History, Rnd, cluster


def writer_life(events, start: int, stop: int):
    """One life of the writer: it folds ``events[:stop]`` from offset 0, remembers what it
    replayed below ``start`` and writes it (sorted by source offset) when it goes live at
    ``start``, then writes each record as it comes. Returns the records, per node, and the state."""
    state = ClusterState()
    builder = ViewBuilder()
    backlog, out = {}, {}
    for offset, event in enumerate(events[:stop]):
        records = builder.records(0, offset, event, apply(state, event), state)
        if offset < start:
            backlog.update({(r.node, r.key): r for r in records})
            continue
        for r in records:
            out.setdefault(r.node, []).append(r.encode())
    resync = {}
    for r in sorted(backlog.values(), key=lambda r: r.value["offset"]):
        resync.setdefault(r.node, []).append(r.encode())
    return {n: resync.get(n, []) + out.get(n, []) for n in set(resync) | set(out)}, state


def expected_work(state: ClusterState, node: str) -> dict:
    """(job, attempt, worker) -> phase: what the log gives ``node`` to run or stop."""
    return {(j.job_id, j.attempt, w.worker): j.phase for j in state.jobs.values() if j.phase.holds_gpus
            for w in j.workers if w.node == node and w.worker not in j.finished}


def view_work(view: NodeView, node: str) -> dict:
    return expected_work(view.state, node)


def read(records) -> NodeView:
    view = NodeView()
    for key, value in records:
        view.apply(key.decode(), decode_value(value))
    return view


def compacted(records) -> list:
    """What a reader may find after compaction: the latest record of each key, in order."""
    last = {key: i for i, (key, _) in enumerate(records)}
    return [r for i, r in enumerate(records) if last[r[0]] == i]


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
    # no view names a node that has no work or registration in the log
    assert set(per_node) <= set(state.nodes)


@SETTINGS
@given(data=st.data())
def test_each_nodes_view_holds_exactly_its_accepted_workers(data):
    h = random_history(data)
    per_node, state = writer_life(h.events, 0, len(h.events))
    check_views(per_node, state, h.events)
    for records in per_node.values():   # one life writes in log order
        offsets = [decode_value(v)["offset"] for _, v in records]
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
    for node, records in both.items():
        view, applied = NodeView(), []
        for key, value in records:
            doc = decode_value(value)
            if view.apply(key.decode(), doc) and doc.get("starts"):
                applied.append((key, doc["offset"]))
        assert len(applied) == len(set(applied))   # no placement acted on twice


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


def test_a_job_record_carries_the_jobs_trace_where_the_writer_has_one():
    log = Log(make_node("a"))
    log.submit("j", gpus=1)
    out = log.place("j", ("a", whole(0)))
    traced = ViewBuilder({"j": {"traceparent": "00-ab-cd-01"}}.get).records(0, 3, log.events[-1], out, log.state)
    assert traced[0].value["trace"] == {"traceparent": "00-ab-cd-01"}
    assert "trace" not in ViewBuilder().records(0, 3, log.events[-1], out, log.state)[0].value
