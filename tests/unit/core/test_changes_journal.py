"""The reducer's journal of changed jobs (``ClusterState.changes``), its journal and count
of node changes (``node_changes``) and count of registrations (``nodes_registered``),
which policies trust instead of comparing every job and node between cycles: every job
whose state an event changed is journalled, every change of a node's registration,
status or GPU health is journalled (a registration counted too), and the journals stay
bounded."""
from __future__ import annotations

from hypothesis import HealthCheck, given, settings, strategies as st

from gpusched.core.reducer import note_changes, note_node
from gpusched.core.state import CHANGES_KEPT, ClusterState
from tests.unit.core.builders import Log, make_node
from tests.unit.policies.kept_ends_steps import NODES, apply_step, step


def jobs_seen(state: ClusterState) -> dict[str, tuple]:
    return {j.job_id: (j.phase, j.attempt, j.workers, j.placed_at, j.started_at, j.time_limit_s,
                       tuple(sorted(j.finished.items())), j.stop_then) for j in state.jobs.values()}


def nodes_seen(state: ClusterState) -> dict[str, tuple]:
    return {n.name: (id(n.info), n.status, tuple(g.healthy for g in n.gpus)) for n in state.nodes.values()}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(step, max_size=40))
def test_every_changed_job_is_journalled_and_every_node_change_counted(steps):
    log = Log(*(make_node(n, gpus=6, cpu=64_000, mem=512_000) for n in NODES))
    made: list[str] = []
    for s in steps:
        state = log.state
        if s in (("drop",), ("drop-nodes",)):
            continue   # the journals' own bound: tested below
        jobs_before, nodes_before = jobs_seen(state), nodes_seen(state)
        position = state.changes_end()
        node_position, registered = state.node_changes_end(), state.nodes_registered
        apply_step(log, s, made)
        journalled = set(state.changes_since(position))
        after = jobs_seen(state)
        assert {j for j, seen in after.items() if jobs_before.get(j) != seen} <= journalled
        nodes_after = nodes_seen(state)
        changed = {n for n, seen in nodes_after.items() if nodes_before.get(n) != seen}
        assert changed <= set(state.node_changes_since(node_position))
        # A node added or its inventory taken again: what readers keep rows by may differ.
        if any(nodes_before.get(n, (None,))[0] != seen[0] for n, seen in nodes_after.items()):
            assert state.nodes_registered > registered


def test_the_journal_drops_its_older_half_past_its_bound():
    """A reader behind what was dropped is told so (None), one after it reads the rest."""
    state = ClusterState()
    note_changes(state, ("a",))
    early = state.changes_end()
    for i in range(CHANGES_KEPT // 1000 + 1):
        note_changes(state, tuple(f"j{i}-{k}" for k in range(1000)))
    assert len(state.changes) <= CHANGES_KEPT
    assert state.changes_since(0) is None
    assert state.changes_since(early) is None
    late = state.changes_end()
    note_changes(state, ("x", "y"))
    assert state.changes_since(late) == ["x", "y"]
    assert state.changes_since(state.changes_end()) == []


def test_the_journal_of_nodes_drops_its_older_half_past_its_bound():
    state = ClusterState()
    note_node(state, "n0")
    early = state.node_changes_end()
    for i in range(CHANGES_KEPT + 1):
        note_node(state, f"n{i % 7}")
    assert len(state.node_changes) <= CHANGES_KEPT
    assert state.node_changes_since(early) is None
    late = state.node_changes_end()
    note_node(state, "x", registered=True)
    assert state.node_changes_since(late) == ["x"] and state.nodes_registered == 1
    assert state.node_changes_end() == CHANGES_KEPT + 3
