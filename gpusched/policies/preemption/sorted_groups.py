"""Edits of the victim index's sorted groups (``VictimIndex``), one group at a time: a
round relists a few hundred entries of groups of tens of thousands, where deleting and
inserting each entry in place would move the group's tail once per entry."""
from __future__ import annotations

from bisect import bisect_left, insort

# Up to this many entries changed in a group, each is deleted or inserted in place.
_IN_PLACE = 4


def edit(group: list, gone: list[tuple], new: list[tuple]) -> None:
    """Remove from the sorted ``group`` one entry per key (its first four fields) in
    ``gone`` and add the entries ``new``, keeping it sorted: the group is rebuilt once
    from slices, each change found by bisection."""
    if len(gone) + len(new) <= _IN_PLACE:
        for key in gone:
            del group[bisect_left(group, key)]
        for entry in new:
            insort(group, entry)
        return
    rest = group
    if gone:
        cuts = sorted(bisect_left(group, key) for key in gone)
        rest, start = [], 0
        for at in cuts:
            at = max(at, start)   # a key gone twice (a job with two workers on the node): the next copy
            rest += group[start:at]
            start = at + 1
        rest += group[start:]
    if new:
        new = sorted(new)
        out, start = [], 0
        for entry in new:
            at = bisect_left(rest, entry, start)
            out += rest[start:at]
            out.append(entry)
            start = at
        out += rest[start:]
        rest = out
    group[:] = rest
