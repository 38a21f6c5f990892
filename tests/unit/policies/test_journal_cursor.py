"""The reader's place in the reducer's journal (``policies.journal_cursor.JournalCursor``)
against a model that remembers what was journalled since the last read: after random
appends, overruns (the older entries dropped), node changes, restored and other states,
a read answers exactly the jobs journalled since, or None exactly when it must."""
from __future__ import annotations

from hypothesis import given, settings, strategies as st

from gpusched.core.reducer import note_changes, note_node
from gpusched.core.state import ClusterState
from gpusched.policies.journal_cursor import JournalCursor, registration_order

# (what happens, a number it takes), changes within one state drawn more often:
# append 1 + n % 4 entries; drop the oldest 1 + n (as ``note_changes`` drops); a node
# changed (no concern of a read of the jobs); the state restored (a new object, its
# journal's end); another state with n entries; a read; start; forget.
KINDS = ("append",) * 3 + ("drop",) * 2 + ("read",) * 3 + ("nodes", "restore", "other", "start", "forget")
step = st.tuples(st.sampled_from(KINDS), st.integers(0, 7))


class Model:
    """What a read must answer: the state last read, and since then the jobs journalled to
    it, whether any of them was dropped unread."""

    def __init__(self) -> None:
        self.state: ClusterState | None = None
        self.unread: list[str] = []
        self.lost = False

    def start(self, state: ClusterState | None) -> None:
        self.state, self.unread, self.lost = state, [], False

    def answer(self, state: ClusterState) -> list[str] | None:
        if state is not self.state or self.lost:
            return None
        return self.unread


def _restored(state: ClusterState) -> ClusterState:
    """As ``gpusched.core.snapshot`` restores one: its journal empty, at the same end."""
    return ClusterState(changes_base=state.changes_end(), node_changes_base=state.node_changes_end(),
                        nodes_registered=state.nodes_registered)


@settings(max_examples=400, deadline=None)
@given(steps=st.lists(step, min_size=4, max_size=60))
def test_a_read_answers_the_jobs_journalled_since_or_none_exactly_when_it_must(steps):
    state, cursor, model, made = ClusterState(), JournalCursor(), Model(), 0
    for kind, arg in steps:
        mine = state is model.state
        if kind == "append":
            jobs = tuple(f"j{made + i}" for i in range(1 + arg % 4))
            made += len(jobs)
            note_changes(state, jobs)
            if mine:
                model.unread.extend(jobs)
        elif kind == "drop":
            dropped = min(1 + arg, len(state.changes))
            del state.changes[:dropped]
            state.changes_base += dropped
            # Fewer entries left than were unread: some went unread.
            model.lost |= mine and len(state.changes) < len(model.unread)
        elif kind == "nodes":
            note_node(state, f"n{arg}", registered=arg % 2 == 0)
        elif kind == "restore":
            state = _restored(state)
        elif kind == "other":
            state = ClusterState()
            note_changes(state, tuple(f"o{i}" for i in range(arg)))
        elif kind == "read":
            assert cursor.read(state) == model.answer(state)
            model.start(state)
        elif kind == "start":
            cursor.start(state)
            model.start(state)
        else:
            cursor.forget()
            model.start(None)
        assert (cursor.state is state) == (model.state is state)


def test_after_a_rebuild_the_cursor_stands_at_the_journals_end():
    """None says: start over from the state as it is. The next read answers only what
    came after."""
    state, cursor = ClusterState(), JournalCursor()
    note_changes(state, ("a",))
    assert cursor.read(state) is None   # never read: another state
    assert cursor.read(state) == []
    note_changes(state, ("b",))
    del state.changes[:2]   # an overrun: "b" dropped unread
    state.changes_base += 2
    assert cursor.read(state) is None
    note_changes(state, ("c", "c"))
    assert cursor.read(state) == ["c", "c"]


def test_entries_dropped_unread_are_a_rebuild():
    state, cursor = ClusterState(), JournalCursor()
    note_changes(state, ("a",))
    cursor.start(state)
    note_changes(state, ("b", "c"))
    del state.changes[:2]   # "a" and "b": "b" was not read
    state.changes_base += 2
    assert cursor.read(state) is None
    note_changes(state, ("d",))
    assert cursor.read(state) == ["d"]


def test_a_reader_of_the_jobs_reads_past_node_changes():
    state, cursor = ClusterState(), JournalCursor()
    cursor.start(state)
    note_node(state, "n0")
    note_node(state, "n1", registered=True)
    note_changes(state, ("a",))
    assert cursor.read(state) == ["a"]


def test_a_restored_state_is_read_afresh_though_its_journal_ends_where_the_first_did():
    state, cursor = ClusterState(), JournalCursor()
    note_changes(state, ("a", "b"))
    cursor.start(state)
    restored = _restored(state)
    assert restored.changes_since(cursor.position) == []   # the numbers alone would not tell
    assert cursor.read(restored) is None
    cursor.forget()
    assert cursor.read(restored) is None and cursor.read(restored) == []


# For ``read_nodes``: jobs journalled; a node's status changed (journalled, n picks it) or
# registered; entries of either journal dropped; reads with and without the jobs, by a
# reader that rebuilds on a registration or one that takes it per node (n // 2 odd).
NODE_KINDS = ("append", "node", "node", "register", "drop", "drop-nodes", "read-nodes", "read-nodes",
              "restore", "other", "start")
node_step = st.tuples(st.sampled_from(NODE_KINDS), st.integers(0, 7))


def _drop(journal: list[str], count: int) -> int:
    dropped = min(count, len(journal))
    del journal[:dropped]
    return dropped


@settings(max_examples=400, deadline=None)
@given(steps=st.lists(node_step, min_size=4, max_size=60))
def test_a_read_of_the_nodes_answers_both_journals_since_or_none_exactly_when_it_must(steps):
    """``read_nodes`` against a model: the jobs and nodes journalled since the last read,
    or None exactly when another state is read, a node registered (for a reader that does
    not take registrations per node), or an entry was dropped unread (of the jobs'
    journal only where the jobs are read)."""
    state, cursor = ClusterState(), JournalCursor()
    model_state, jobs, nodes, lost_jobs, lost_nodes, registered = None, [], [], False, False, False
    for kind, arg in steps:
        mine = state is model_state
        if kind == "append":
            note_changes(state, (f"j{arg}",))
            jobs.append(f"j{arg}")
        elif kind in ("node", "register"):
            note_node(state, f"n{arg}", registered=kind == "register")
            nodes.append(f"n{arg}")
            registered |= kind == "register"
        elif kind == "drop":
            state.changes_base += _drop(state.changes, 1 + arg)
            lost_jobs |= len(state.changes) < len(jobs)
        elif kind == "drop-nodes":
            state.node_changes_base += _drop(state.node_changes, 1 + arg)
            lost_nodes |= len(state.node_changes) < len(nodes)
        elif kind == "restore":
            state = ClusterState(changes_base=state.changes_end(), node_changes_base=state.node_changes_end(),
                                 nodes_registered=state.nodes_registered)
        elif kind == "other":
            state = ClusterState()
        if kind == "read-nodes":
            with_jobs, per_node = arg % 2 == 0, arg // 2 % 2 == 1
            rebuilds = registered and not per_node
            expected = None if not mine or rebuilds or lost_nodes or (with_jobs and lost_jobs) else \
                (jobs if with_jobs else [], nodes)
            assert cursor.read_nodes(state, jobs=with_jobs, registered=per_node) == expected
        elif kind == "start":
            cursor.start(state)
        else:
            continue
        model_state, jobs, nodes, lost_jobs, lost_nodes, registered = state, [], [], False, False, False


def test_a_cordon_is_read_as_a_node_and_a_registration_as_one_where_the_reader_takes_it():
    state, cursor = ClusterState(), JournalCursor()
    cursor.start(state)
    note_node(state, "n1")
    assert cursor.read_nodes(state) == ([], ["n1"])
    note_node(state, "n2", registered=True)
    assert cursor.read_nodes(state) is None
    assert cursor.read_nodes(state) == ([], [])
    note_node(state, "n3", registered=True)
    note_changes(state, ("a",))
    assert cursor.read_nodes(state, registered=True) == (["a"], ["n3"])


def test_registration_order_is_the_place_in_the_state():
    nodes = {f"n{i}": None for i in range(6)}
    assert [registration_order(nodes, name) for name in nodes] == list(range(6))   # type: ignore[arg-type]
    try:
        registration_order(nodes, "x")   # type: ignore[arg-type]
    except KeyError:
        pass
    else:
        raise AssertionError("an unknown node has no place")
