"""The victim index's lists of entries (``VictimIndex``): per pool, per team (None: the
priority list) and per (class, size), a group of entries ordered by when the work a
preemption would lose began (``victim_rules.work_began``: later first, a job never
started first), an order ``now`` does not change; ``candidates`` merges the groups of
the classes the rule lets a pending job take (``lower_class``, ``reclaimable_class``) by
their bounds at ``now`` (``set_key_bound``).

``VictimGroups`` keeps each node's entries (``on``) so that a node listed again leaves
its entries that are as they were in their groups, and edits each changed group once
(``sorted_groups.edit``); ``spread`` holds the nodes running a listed job spread over
several nodes.
"""
from __future__ import annotations

import heapq
from typing import Iterator, Mapping

from gpusched.core.priority import PRIORITY_CLASSES
from gpusched.core.state import JobState, NodeState
from gpusched.policies.preemption.sorted_groups import edit
from gpusched.policies.preemption.victim_rules import lower_class, reclaimable_class, set_key_bound, work_began

# (bound, 0 when the node runs a spread job else 1, node, seq, job)
Entry = tuple[tuple, int, str, int, JobState]
# A group's entry: (minus when its work began, flag, node, seq, job); with its group.
Pair = tuple[list, tuple]


# An entry's bound: the rule's lower bound of the rank of a victim set it tops.
bound = set_key_bound


def _walk(group: list, now: float) -> Iterator[Entry]:
    """A group's entries by bound at ``now``: its order, but for equal bounds (rounded),
    which go spread nodes first, then by node."""
    i, n = 0, len(group)
    while i < n:
        key = bound(group[i][4], now)
        run = [group[i]]
        i += 1
        while i < n and bound(group[i][4], now) == key:
            run.append(group[i])
            i += 1
        if len(run) > 1:
            run.sort(key=lambda e: (e[1], e[2], e[3]))
        for e in run:
            yield (key, e[1], e[2], e[3], e[4])


class VictimGroups:
    """The entries of every node, in their groups (see the module doc)."""

    def __init__(self) -> None:
        # pool -> team (None: priority) -> (class, milli) -> entries (work began, flag, node, seq, job)
        self.groups: dict[str, dict[str | None, dict[tuple[int, int], list]]] = {}
        self.on: dict[str, list[Pair]] = {}   # node -> its (group, entry) pairs
        self.spread: set[str] = set()

    def candidates(self, pool: str, mine: int, team: str, reclaim: bool, now: float) -> Iterator[Entry]:
        """``VictimIndex.candidates``, at ``now``."""
        lists = self.groups.get(pool, {})
        walks = [_walk(g, now) for (cls, _), g in lists.get(None, {}).items() if g and lower_class(cls, mine)]
        if reclaim:
            walks += [_walk(g, now) for other, groups in lists.items() if other is not None and other != team
                      for (cls, _), g in groups.items() if g and reclaimable_class(cls, mine)]
        return walks[0] if len(walks) == 1 else heapq.merge(*walks)

    def take_off(self, name: str, only: set[str] | None = None) -> tuple[dict[tuple, list[Pair]], list[Pair]]:
        """Node ``name``'s pairs of the jobs ``only`` (None: all), keyed by group, the
        entry's fields and its job object (a job changed is listed anew; a job with two
        workers on the node has two); and its other pairs, which stay as they are."""
        was: dict[tuple, list[Pair]] = {}
        kept: list[Pair] = []
        for g, e in self.on.pop(name, ()):
            if only is None or e[4].job_id in only:
                was.setdefault((id(g), e[0], e[1], e[3], id(e[4])), []).append((g, e))
            else:
                kept.append((g, e))
        self.spread.discard(name)
        return was, kept

    def put_on(self, node: NodeState, here: list[JobState], listed: Mapping[str, list[bool]], spread: bool,
               was: dict[tuple, list[Pair]], added: list[Pair], kept: list[Pair] | None = None) -> None:
        """List the entries of ``here`` (jobs on ``node``; ``spread``: one of its listed
        jobs runs on other nodes too) beside its ``kept`` pairs; those not in ``was``
        (taken from it: what is left there is gone) are ``added``."""
        name, pool = node.name, node.info.pool
        if spread:
            self.spread.add(name)
        flag, on, classes = 0 if spread else 1, kept if kept is not None else [], PRIORITY_CLASSES
        groups = self.groups.get(pool)
        if groups is None:
            groups = self.groups[pool] = {}
        for job in here:
            yes = listed.get(job.job_id)
            if yes is None:
                continue
            spec = job.spec
            cls, milli = classes.get(spec.priority_class, 0), spec.total_milli   # priority_value, milli
            # Minus when the work a preemption would lose began: the later, the less lost.
            began = -work_began(job)
            entry = (began, flag, name, job.seq, job)
            for team, wanted in ((None, yes[0]), (spec.team, yes[1])):
                if wanted:
                    by_size = groups.get(team)
                    if by_size is None:
                        by_size = groups[team] = {}
                    group = by_size.get((cls, milli))
                    if group is None:
                        group = by_size[(cls, milli)] = []
                    pair = (group, entry)
                    on.append(pair)
                    same = was.get((id(group), began, flag, job.seq, id(job)))
                    if same:
                        same.pop()
                    else:
                        added.append(pair)
        self.on[name] = on

    def settle(self, gone: list[Pair], added: list[Pair], fresh: bool) -> None:
        """Take the ``gone`` entries out of their groups and put the ``added`` in, each
        group edited once (``fresh``: every group was empty: filled, then sorted once)."""
        if fresh:
            for group, entry in added:
                group.append(entry)
            for teams in self.groups.values():
                for groups in teams.values():
                    for group in groups.values():
                        group.sort()
            return
        edits: dict[int, tuple[list, list, list]] = {}   # group -> (group, keys gone, entries new)
        for pairs, at in ((gone, 1), (added, 2)):
            for group, entry in pairs:
                found = edits.get(id(group))
                if found is None:
                    found = edits[id(group)] = (group, [], [])
                found[at].append(entry[:4] if at == 1 else entry)
        for group, keys, entries in edits.values():
            edit(group, keys, entries)
