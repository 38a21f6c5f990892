"""Snapshots leave the reducer's journal of changed jobs (``ClusterState.changes``) out:
only where it ends is written, a restored state's journal starts empty there, and a
reader holding a position from before the snapshot rebuilds instead of reading the
restored journal as a continuation."""
from __future__ import annotations

import json
import zlib

from gpusched.core import events as ev
from gpusched.core import snapshot as snap
from gpusched.core.model import JobSpec, WorkerResources
from gpusched.core.reducer import apply, note_changes, note_node
from gpusched.core.snapshot import snapshot_bytes, snapshot_doc, state_from_snapshot
from gpusched.core.state import ClusterState
from gpusched.policies.touched_nodes import TouchedNodes
from tests.unit.core.builders import _sample_state


def _with_long_journal() -> ClusterState:
    state = _sample_state()
    for i in range(200):
        note_changes(state, tuple(f"x{i}-{k}" for k in range(100)))
    return state


def test_the_snapshot_writes_where_the_journal_ends_not_its_entries():
    state = _with_long_journal()
    doc = snapshot_doc(state)
    assert "changes" not in doc["schema"]["ClusterState"] and "changes" not in doc["state"]
    assert doc["state"]["changes_base"] == [state.changes_end()]
    # The same state with its journal emptied at the same end: the very same bytes.
    bare = _with_long_journal()
    bare.changes_base, bare.changes = bare.changes_end(), []
    assert snapshot_bytes(state) == snapshot_bytes(bare)


def test_a_restored_journal_is_empty_and_every_earlier_position_rebuilds():
    state = _with_long_journal()
    end = state.changes_end()
    restored = state_from_snapshot(snapshot_bytes(state))
    assert restored.changes == [] and restored.changes_end() == end
    for position in (0, state.changes_base, end - 1):
        assert restored.changes_since(position) is None
    assert restored.changes_since(end + 1) is None   # a position from a journal that went further
    assert restored.changes_since(end) == []


def test_a_reader_of_the_snapshotted_state_rebuilds_from_the_restored_one_then_reads_on():
    state = _sample_state()
    reader = TouchedNodes()
    assert reader.since_last(state) is None   # first look: built from the state
    assert reader.since_last(state) == set()
    restored = state_from_snapshot(snapshot_bytes(state))
    assert reader.since_last(restored) is None
    out = apply(restored, ev.JobSubmitted(event_id="late", time=99.0, job_id="late",
                                          spec=JobSpec("late", "t1", resources=WorkerResources(gpus=1))))
    assert out.accepted, out.reason
    assert restored.changes_since(restored.changes_end() - 1) == ["late"]
    assert reader.since_last(restored) == set()   # journalled, but holds no node yet


def test_a_snapshot_that_still_carries_the_journal_restores_it_empty_at_its_end():
    state = _with_long_journal()
    doc = json.loads(json.dumps(snapshot_doc(state)))
    doc["schema"]["ClusterState"].append("changes")
    doc["state"]["changes"] = {"n": [len(state.changes)], "items": state.changes}
    doc["state"]["changes_base"] = [state.changes_base]
    old = snap.MAGIC + bytes([snap.FORMAT_VERSION]) + zlib.compress(json.dumps(doc).encode())
    restored = state_from_snapshot(old)
    assert restored.changes == [] and restored.changes_end() == state.changes_end()
    assert restored.changes_since(state.changes_base) is None


def test_the_journal_of_nodes_is_left_out_too():
    state = _sample_state()
    for i in range(300):
        note_node(state, f"n{i % 5}")
    doc = snapshot_doc(state)
    assert "node_changes" not in doc["schema"]["ClusterState"] and "node_changes" not in doc["state"]
    assert doc["state"]["node_changes_base"] == [state.node_changes_end()]
    restored = state_from_snapshot(snapshot_bytes(state))
    assert restored.node_changes == [] and restored.node_changes_end() == state.node_changes_end()
    assert restored.node_changes_since(state.node_changes_base) is None


def test_a_snapshot_that_carries_the_retired_count_of_node_changes_restores():
    """Snapshots once wrote ``ClusterState.nodes_version`` (every node change counted,
    now read from the journal of nodes alone): one of those restores, the count read past."""
    state = _sample_state()
    doc = json.loads(json.dumps(snapshot_doc(state)))
    doc["schema"]["ClusterState"].append("nodes_version")
    doc["state"]["nodes_version"] = [7]
    old = snap.MAGIC + bytes([snap.FORMAT_VERSION]) + zlib.compress(json.dumps(doc).encode())
    assert snapshot_bytes(state_from_snapshot(old)) == snapshot_bytes(state)
