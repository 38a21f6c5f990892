"""The victim search of ``victim_search`` on the preemptor's index of candidate victims
(kept between rounds), or on defragmentation's movable jobs (``defrag.MovableEntries``):
the same steps and the same answer, without looking at every node of the pool.

``VictimSearch`` decides every running job's eligibility and cost, counts every node's
worker slots and computes every node's step before it picks the cheapest, which makes
each decision cost about the pool's size. ``IndexedSearch`` reads instead:

* the pool's worker slots from a kept ``SlotCounts`` (only nodes with slots are listed);
* candidate victims in order of a lower bound of the rank of a set they top
  (``victim_index``): a node is looked at (its victims' eligibility and cost, its step) when
  the walk first meets an eligible victim on it, and the walk stops once the next bound is
  above the best step found — every node not yet looked at would rank at or above it
  (``cheapest_steps``: above the k-th best, for defragmentation's candidate plans);
* for a whole-GPU job, the most GPUs any node could free (``VictimIndex.most_freeable``):
  below a worker's GPUs, no node can gain a slot and the search ends before any node.

The steps are those ``VictimSearch`` would have cached, so the choice is the same: a
node's step changes only when its own jobs or capacity change (then it is recomputed, as
in ``VictimSearch``), or, for a victim running on several nodes, when another of those
nodes changes (the step's gain counts them). Before a step changes nodes, every node that
shares a multi-node victim with them and was not looked at yet gets its step computed on
the state as it still is.
"""
from __future__ import annotations

from bisect import insort
from typing import AbstractSet, Callable, Iterator, Mapping, Sequence

from gpusched.core.state import ClusterState, JobState, NodeState
from gpusched.policies.preemption.victim_search import Step, VictimSearch, could_host
from gpusched.policies.preemption.victim_index import Entry
from gpusched.policies.statement import Statement


class CandidateNodes:
    """The nodes that could ever host a worker of ``res``: schedulable, in the job's pool;
    decided on first question."""

    def __init__(self, nodes: Mapping[str, NodeState], pool: str, res,
                 within: AbstractSet[str] | None = None) -> None:
        self._nodes, self._pool, self._res, self._within = nodes, pool, res, within
        self._known: dict[str, bool] = {}

    def __contains__(self, name: object) -> bool:
        ok = self._known.get(name)    # type: ignore[arg-type]
        if ok is None:
            node = self._nodes.get(name)    # type: ignore[arg-type]
            ok = self._known[name] = (node is not None and node.info.pool == self._pool   # type: ignore[index]
                                      and node.schedulable and could_host(node, self._res)
                                      and (self._within is None or name in self._within))
        return ok

    def __getitem__(self, name: str) -> NodeState:
        return self._nodes[name]


class NodeVictims:
    """Each looked-at node's eligible victims, cheapest first, decided on first question."""

    def __init__(self, search: "IndexedSearch") -> None:
        self._search = search
        self._on: dict[str, list[JobState]] = {}

    def get(self, name: str, default=()) -> Sequence[JobState]:
        found = self._on.get(name)
        if found is None:
            search = self._search
            jobs = search.state.jobs
            found = [jobs[jid] for jid in search.nodes[name].jobs if search.eligible(jobs[jid])]
            found.sort(key=search.cost)
            self._on[name] = found
        return found or default


class Slots:
    """Worker slots by node: the kept counts as the search began, overridden by the nodes
    the search recounted; ``total`` their sum."""

    def __init__(self, kept: Mapping[str, int], total: int) -> None:
        self._kept, self._mine, self.total = kept, {}, total

    def __getitem__(self, name: str) -> int:
        n = self._mine.get(name)
        return self._kept.get(name, 0) if n is None else n

    def __setitem__(self, name: str, n: int) -> None:
        self.total += n - self[name]
        self._mine[name] = n


class IndexedSearch(VictimSearch):
    """``VictimSearch`` over ``candidates`` (eligible or not, by bound) and kept slot counts
    (see the module doc); ``within``: the only nodes it may free (one topology domain)."""

    def __init__(self, state: ClusterState, job: JobState, scratch: Statement,
                 eligible: Callable[[JobState], bool], cost: Callable[[JobState], tuple],
                 set_key: Callable[[Sequence[JobState]], tuple], max_victims: int | None,
                 candidates: Iterator[Entry], slots: Mapping[str, int], total_slots: int,
                 spread: AbstractSet[str], most_freeable: int | None = None,
                 within: AbstractSet[str] | None = None) -> None:
        # Not VictimSearch.__init__: it scans the pool.
        self._begin(state, job, scratch, eligible, cost, set_key, max_victims)
        self.nodes = CandidateNodes(state.nodes, job.spec.pool, self.res, within)    # type: ignore[assignment]
        self.victims_on = NodeVictims(self)    # type: ignore[assignment]
        if within is not None:
            total_slots, slots = sum(slots.get(n, 0) for n in within), {n: slots[n] for n in within if n in slots}
        self.slots = Slots(slots, total_slots)    # type: ignore[assignment]
        self._candidates, self._spread = candidates, spread
        self._most_freeable = most_freeable
        self._next: Entry | None = None

    def _cannot_gain(self) -> bool:
        """No node can take one more worker whatever is released: for a whole-GPU job,
        when the most GPUs any node could free (``VictimIndex.most_freeable``) are fewer
        than a worker's. Every step would then be None, as the walk would find node by node."""
        res, most = self.res, self._most_freeable
        return most is not None and res.gpus > 0 and not res.is_share and not res.is_mig and most < res.gpus

    def total(self) -> int:
        return self.slots.total    # type: ignore[attr-defined]

    def _bound_of_next(self, steps: Mapping[str, Step | None]) -> Entry | None:
        """The next entry whose victim is eligible, on a candidate node not looked at yet."""
        while True:
            entry = self._next
            if entry is None:
                entry = next(self._candidates, None)
                if entry is None:
                    return None
                self._next = entry
            name, victim = entry[2], entry[4]
            if name not in steps and name in self.nodes and self.eligible(victim):
                return entry
            self._next = None

    def _best(self, steps: dict[str, Step | None], best: tuple | None) -> tuple | None:
        """Look at nodes by bound until the next bound is above the best step's key."""
        while (entry := self._bound_of_next(steps)) is not None:
            if best is not None and self._beyond(entry, best[0]):
                break
            self._next = None
            name = entry[2]
            step = steps[name] = self.node_step(name)
            if step is not None:
                key = (step.key, -step.gain, name)
                if best is None or key < best[0]:
                    best = (key, name, step)
        return best

    def _beyond(self, entry: Entry, best: tuple) -> bool:
        """Whether no node from ``entry`` on can beat the ``best`` key (step key, -gain,
        name). A node's step key is at least its first entry's bound; on a node whose
        listed jobs each run on it only, a step gains at most ``need`` slots; and equal
        bounds come spread nodes first, then by name."""
        bound, name = entry[0], entry[2]
        if bound != best[0]:
            return bound > best[0]
        return name not in self._spread and (-self.need, name) > best[1:]

    def cheapest_steps(self, k: int) -> list[tuple[tuple, str, list[JobState]]]:
        """``VictimSearch.cheapest_steps``: nodes looked at by bound until ``k`` steps are
        found and the next bound is above the ``k``-th key (a node's key is at least its
        first entry's bound, so no node left could come before it)."""
        found: list[tuple[tuple, str, list[JobState]]] = []
        if k <= 0:
            return found
        steps: dict[str, Step | None] = {}
        while (entry := self._bound_of_next(steps)) is not None:
            if len(found) >= k and entry[0] > found[-1][0]:
                break
            self._next = None
            name = entry[2]
            step = steps[name] = self.node_step(name)
            if step is not None:
                insort(found, (step.key, name, step.victims), key=lambda s: (s[0], s[1]))
                del found[k:]
        return found

    def _before_change(self, steps: dict[str, Step | None], victims: Sequence[JobState]) -> None:
        """Compute, on the state as it still is, the steps of the nodes not looked at that
        share a multi-node victim with a node ``victims`` are about to change."""
        for name in {w.node for v in victims for w in v.workers if w.node in self.nodes}:
            for v in self.victims_on.get(name, ()):
                spread = {w.node for w in v.workers}
                if len(spread) < 2 or v.job_id in self.released_ids:
                    continue
                for other in spread:
                    if other not in steps and other in self.nodes:
                        steps[other] = self.node_step(other)

    def run(self) -> list[JobState] | None:
        if self.total() >= self.need:
            return []
        if self._cannot_gain():
            return None
        steps: dict[str, Step | None] = {}
        stale: set[str] = set()
        mark = self.scratch.checkpoint()
        try:
            while self.total() < self.need:
                for name in stale:
                    steps[name] = self.node_step(name)
                best: tuple | None = None
                for name, step in steps.items():
                    if step is None:
                        continue
                    key = (step.key, -step.gain, name)
                    if best is None or key < best[0]:
                        best = (key, name, step)
                best = self._best(steps, best)
                if best is None:
                    return None
                step = best[2]
                self._before_change(steps, step.victims)
                touched = self._take(step)
                if touched is None:
                    return None
                stale = touched | {best[1]}
            return self._drop_unneeded()
        finally:
            self.scratch.rollback(mark)
