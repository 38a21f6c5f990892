"""The most GPUs any node of a pool could have free once every job a pending job of a
given class may take were gone (``VictimIndex.most_freeable``), kept through the index's
relisting: each node's freeable GPUs per class threshold (``freeable_vector``), and per
pool and threshold how many nodes have each value (``MostFreeable``)."""
from __future__ import annotations

from collections import Counter
from typing import Mapping

from gpusched.core.priority import PRIORITY_CLASSES, priority_value
from gpusched.core.state import JobState, NodeState
from gpusched.policies.preemption.victim_rules import lower_class, reclaimable_class

# Class thresholds of ``most_freeable``: every class a job can have.
CLASSES = tuple(sorted(set(PRIORITY_CLASSES.values()) | {0}))


def _first_place(takes) -> dict[int, int]:
    """Per class: the place in ``CLASSES`` of the lowest threshold whose pending jobs may
    take a job of that class by the rule ``takes`` (its len: none may); every higher
    threshold may too (the rule's class comparisons are monotone)."""
    return {c: next((i for i, mine in enumerate(CLASSES) if takes(c, mine)), len(CLASSES)) for c in CLASSES}


_PRIORITY_FROM = _first_place(lower_class)        # a class above its own
_RECLAIM_FROM = _first_place(reclaimable_class)   # its own class


def freeable_vector(node: NodeState, here: list[JobState], listed: Mapping[str, list[bool]]) -> tuple[int, ...]:
    """For each class threshold c (and reclaim or not): the node's GPUs less those held
    by jobs a pending job of class c may not take (``VictimIndex.candidates``' rule, all
    teams); ``listed``: each listed job's [for priority, for reclaim].
    A job may be taken from some threshold on (``_PRIORITY_FROM``, ``_RECLAIM_FROM``, the
    rule's class comparisons): its GPUs are bucketed by that threshold's place in
    ``CLASSES``, and what is held at a threshold is what the buckets above it hold."""
    name, last = node.name, len(CLASSES)
    by_priority, by_reclaim = [0] * (last + 1), [0] * (last + 1)   # bucket: from that place on
    for job in here:
        mask = 0
        for w in job.workers:
            if w.node == name:
                for slot in w.gpus:
                    mask |= 1 << slot.index
        by_rule = listed.get(job.job_id)
        if by_rule is None:
            by_priority[last] |= mask
            by_reclaim[last] |= mask
            continue
        cls = priority_value(job.spec.priority_class)
        priority_from = _PRIORITY_FROM[cls] if by_rule[0] else last
        by_priority[priority_from] |= mask
        by_reclaim[min(priority_from, _RECLAIM_FROM[cls]) if by_rule[1] else priority_from] |= mask
    total, out = len(node.gpus), [0] * (2 * last)
    held, held_reclaim = by_priority[last], by_reclaim[last]
    for place in range(last - 1, -1, -1):
        out[2 * place] = total - held.bit_count()
        out[2 * place + 1] = total - held_reclaim.bit_count()
        held |= by_priority[place]
        held_reclaim |= by_reclaim[place]
    return tuple(out)


class MostFreeable:
    """Per pool and class threshold (and reclaim or not): how many nodes could free each
    number of GPUs; told of each node's vector as it is listed again (``count``)."""

    def __init__(self) -> None:
        self._of: dict[str, tuple[str, tuple[int, ...]]] = {}   # node -> (pool, vector)
        self._most: dict[str, list[Counter]] = {}     # pool -> per threshold: vector values

    def most(self, pool: str, mine: int, reclaim: bool) -> int | None:
        """The most GPUs a node of ``pool`` could free for a job of class ``mine``; None
        for a class not among ``CLASSES``."""
        if mine not in CLASSES:
            return None
        counts = self._most.get(pool)
        return max(counts[CLASSES.index(mine) * 2 + reclaim], default=0) if counts is not None else 0

    def count(self, name: str, now_is: tuple[str, tuple[int, ...]] | None) -> None:
        """Count node ``name``'s (pool, vector) now, or none (gone), instead of what it was."""
        was = self._of.pop(name, None)
        if was is not None:
            counts = self._most[was[0]]
            for i, v in enumerate(was[1]):
                counts[i][v] -= 1
                if not counts[i][v]:
                    del counts[i][v]
        if now_is is not None:
            self._of[name] = now_is
            counts = self._most.get(now_is[0])
            if counts is None:
                counts = self._most[now_is[0]] = [Counter() for _ in range(2 * len(CLASSES))]
            for count, v in zip(counts, now_is[1]):
                count[v] = count.get(v, 0) + 1
