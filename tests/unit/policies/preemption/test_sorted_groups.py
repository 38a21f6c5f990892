"""The victim index's group edits (``sorted_groups.edit``) leave a group as removing and
inserting each entry in place would: sorted, the gone entries out, the new ones in."""
from hypothesis import given, strategies as st

from gpusched.policies.preemption.sorted_groups import edit

# (began, flag, node, seq, job): seq is unique, as each job's is.
_entries = st.lists(st.tuples(st.integers(-5, 5), st.integers(0, 1), st.sampled_from("abc")),
                    max_size=40, unique=True)


@given(_entries, st.data())
def test_an_edit_removes_and_inserts_as_one_by_one(raw, data):
    entries = [(b, f, n, seq, object()) for seq, (b, f, n) in enumerate(raw)]
    # An entry may be in a group twice (a job with two workers on one node).
    start = data.draw(st.lists(st.sampled_from(entries))) if entries else []
    group = sorted(start, key=lambda e: e[:4])
    at = data.draw(st.lists(st.integers(0, len(group) - 1), unique=True)) if group else []
    gone = [group[i] for i in at]
    rest = [e for e in entries if all(e is not s for s in start)]
    new = data.draw(st.lists(st.sampled_from(rest), unique_by=id)) if rest else []
    want = sorted([e for i, e in enumerate(group) if i not in at] + new, key=lambda e: e[:4])
    kept = group
    edit(group, [g[:4] for g in gone], new)
    assert group is kept
    assert [e[:4] for e in group] == [e[:4] for e in want]
    assert all(a is b for a, b in zip(group, want))
