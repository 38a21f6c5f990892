"""The placement policies ``fgd`` (FGD, Weng et al., "Beware of Fragmentation", ATC'23)
and ``fgd-lookahead`` (ours: FGD with a look-ahead at the waste it leaves behind): each
worker where fragmentation grows least, by the rule of ``fragmentation``.

The choice is the first node, in registration order, of the least key: the same
decision as sorting every candidate (``ranked``), which ``scan`` still does where a node
refuses what the arrays offered and for gangs (``rank``). At placer speed: the first
request of a kind in a cycle is scored with numpy over the pool (one node per group of
equal nodes); after that the pool's scores (``pool_scores.PoolScores``) keep, per
request, each node's best candidate, and a decision rescores only the nodes changed
since (the one it booked, usually), in plain Python (``node_scores``), bit for bit the
numpy scores.
"""
from __future__ import annotations

from dataclasses import fields
from operator import attrgetter
from typing import Iterable, Sequence

import numpy as np

from gpusched.core.model import GpuSlot, WorkerResources
from gpusched.core.state import JobState, NodeState
from gpusched.policies.statement import LentState, Statement
from gpusched.policies.gpu_fit import StateLike, fits_node, pick_gpus
from gpusched.policies.placement.gang import Choice
from gpusched.policies.placement.arrays import arrays_for
from gpusched.policies.placement.fgd.fragmentation import (
    PATIENCE, POPULARITY, candidates, fgd_score, growth)
from gpusched.policies.placement.fgd.node_scores import Row, kept_scorer
from gpusched.policies.placement.fgd.pool_scores import (
    CACHED_REQUESTS, FEW_ROWS, NONE, Best, Need, PoolScores)
from gpusched.policies.placement.fgd.task_mix import fix_mixes, pool_mix
from gpusched.policies.placement.heuristics import choose_mig, rank_mig


# Every field of a request: the key of its ``Best`` in the view.
_FIELDS = attrgetter(*(f.name for f in fields(WorkerResources)))


class Fgd:
    """Fragmentation gradient descent: least growth of fragmentation, then first fit."""

    name = "fgd"
    lookahead = False   # whether ``packed`` adds fgd-lookahead's keys (``node_scores`` mirrors it)

    def __init__(self, popularity: float = POPULARITY) -> None:
        if not 0 < popularity <= 1:
            raise ValueError(f"popularity must be in (0, 1], not {popularity!r}")
        self.popularity = popularity
        self.patience = PATIENCE   # what the view's final waste uses; FGD itself never asks

    def lend(self, lent: LentState, statement: Statement) -> None:
        """The pools' mixes of a state lent to ``statement``, counted while it is the log's."""
        fix_mixes(lent, statement)

    def choose(self, state: StateLike, statement: Statement, job: JobState, res: WorkerResources) -> Choice | None:
        pool = job.spec.pool
        if res.is_mig:
            return choose_mig(statement, state.nodes, pool, res)
        view = self.view(state, statement, pool)
        found = self.first(view, res)
        if found is None:
            return None
        node = view.arrays.nodes[found[0]]
        slots = take(node, pool, res, found[1])
        if slots is not None:
            return node, slots
        # The arrays mirror what ``take`` checks (GPU memory included), so the node takes
        # the first candidate; were they ever to differ, walk the whole order as ``scan`` does.
        return self.scan(view, pool, res)

    def scan(self, view: PoolScores, pool: str, res: WorkerResources) -> Choice | None:
        """Every candidate in order, best first, until a node takes one."""
        arrays = view.arrays
        rows = arrays.feasible(res)
        if not rows.size:
            return None
        rows, gpu_index, best = self.ranked(view, rows, res)
        for i in best:
            node = arrays.nodes[rows[i]]
            slots = take(node, pool, res, int(gpu_index[i]))
            if slots is not None:
                return node, slots
        return None

    def first(self, view: PoolScores, res: WorkerResources) -> tuple[int, int] | None:
        """(row, GPU index) of the first candidate in ``ranked``'s order over every
        feasible row, or None: from each node's best candidate, kept per request and
        recomputed only for the nodes changed since it was last asked."""
        view.sync()
        request = _FIELDS(res)   # hashed and compared in C, not by the dataclass's methods
        best = view.best.get(request)
        if best is None:
            if len(view.best) >= CACHED_REQUESTS:
                del view.best[next(iter(view.best))]   # the oldest
            count = len(view.arrays.nodes)
            need = Need(res.cpu_milli, res.memory_mib, res.gpu_milli if res.is_share else 0, res.gpus,
                        view.arrays.allowed_models(res))
            best = view.best[request] = Best(len(view.changed), len(view.grew), np.full(count, NONE, dtype=np.int64),
                                             np.zeros(count, np.int64), set(), view.scorer.scorer(res), need)
            best.fits.update(self.fill(view, best, res))
        elif best.seen < len(view.changed):
            self.catch_up(view, best, res)
        if not best.key.size:        # a pool without nodes
            return None
        i = int(best.key.argmin())   # the first row of the least key: registration order
        return None if best.key.item(i) == NONE else (i, best.gpu.item(i))   # item: a Python int

    def catch_up(self, view: PoolScores, best: Best, res: WorkerResources) -> None:
        """Rescore the rows changed since ``best`` last saw the view: those that fitted,
        and those that grew (capacity that only shrank cannot make a node fit; GPU memory
        aside, which ``Best.fits`` leaves aside)."""
        fits, changed, grew = best.fits, view.changed, view.grew
        rows = fits.intersection(view.since(best.seen))
        if best.grown < len(grew):
            rows.update(grew[best.grown:])
        best.seen, best.grown = len(changed), len(grew)
        if len(rows) <= FEW_ROWS:
            self.rescore(view, best, rows, res)
            return
        at = np.array(sorted(rows), dtype=np.int64)
        best.key[at] = NONE
        feasible = view.arrays.feasible(res, at)
        self.refresh(view, best, feasible, res)
        fits.difference_update(rows)
        fits.update(feasible.tolist())

    def fill(self, view: PoolScores, best: Best, res: WorkerResources) -> list[int]:
        """``best`` of a request asked for the first time in the cycle: rows that have
        not changed since the view was built score alike within a group of equal rows,
        so one row of each group is scored, on its values when the view was built (in
        plain Python when the groups are few); the changed ones are scored one by one.
        Returns the feasible rows but the changed ones ``rescore`` added to ``fits``."""
        if not len(view.moved):   # a pool without nodes
            return []
        memory = bool(res.is_share and res.gpu_memory_mib)
        reps = view.representatives(memory)
        if len(reps) > FEW_ROWS:
            return self.fill_numpy(view, best, res, memory).tolist()
        fits = self.fill_groups(view, best, reps, res, memory)
        changed = list(view.plain)   # the rows changed since the view was built
        if len(changed) > FEW_ROWS:
            at = view.arrays.feasible(res, np.array(sorted(changed), dtype=np.int64))
            self.refresh(view, best, at, res)
            return fits + at.tolist()
        self.rescore(view, best, changed, res)
        return fits

    def fill_groups(self, view: PoolScores, best: Best, reps: list[Row], res: WorkerResources,
                    memory: bool) -> list[int]:
        """``fill``'s unchanged rows: each group's best candidate scored on one row,
        as ``rescore`` scores it. Returns the unchanged rows that take ``res``. A group's
        rows may differ in free host memory, which no score reads: each row's own is
        checked, not its group's."""
        # Python lists, one numpy array each at the end: a few hundred groups a request,
        # and numpy's cost is per element written. The last entry: the changed rows.
        key, gpu, taken = [NONE] * (len(reps) + 1), [0] * (len(reps) + 1), [False] * (len(reps) + 1)
        need_cpu, _, share, gpus, allowed = best.need
        score = best.score
        for g, row in enumerate(reps):
            # ``row_takes`` but host memory (checked row by row below), inline as in ``rescore``
            if row.cpu >= need_cpu and row.mem >= 0 and allowed[row.model] and row.largest >= share \
                    and row.whole >= gpus:
                taken[g] = True
                found = score(row)
                if found is not None:
                    key[g], gpu[g] = found
        key, gpu, taken = np.array(key, dtype=np.int64), np.array(gpu, dtype=np.int64), np.array(taken, dtype=bool)
        group = np.where(view.moved, len(reps), view.memory_group if memory else view.group)
        ok = taken[group] & (view.arrays.mem >= res.memory_mib)
        best.key[:], best.gpu[:] = np.where(ok, key[group], NONE), gpu[group]
        return np.flatnonzero(ok).tolist()

    def fill_numpy(self, view: PoolScores, best: Best, res: WorkerResources, memory: bool) -> np.ndarray:
        """``fill`` with numpy, one row of each group at once (many groups)."""
        rows = view.arrays.feasible(res)
        moved = view.moved[rows]
        fresh = rows[~moved]
        if fresh.size:
            group = view.memory_group if memory else view.group
            _, first, inverse = np.unique(group[fresh], return_index=True, return_inverse=True)
            scored = fresh[first]
            self.refresh(view, best, scored, res)
            best.key[fresh] = best.key[scored][inverse]
            best.gpu[fresh] = best.gpu[scored][inverse]
        changed = rows[moved]
        if changed.size > FEW_ROWS:
            self.refresh(view, best, changed, res)
        elif changed.size:
            self.rescore(view, best, changed.tolist(), res)
        return rows

    def rescore(self, view: PoolScores, best: Best, rows: Iterable[int], res: WorkerResources) -> None:
        """``refresh`` of a few changed rows, one by one (``node_scores``: the same numbers)."""
        plain, key, index, fits, score = view.plain, best.key, best.gpu, best.fits, best.score
        need_cpu, need_mem, share, gpus, allowed = best.need
        for i in rows:
            row = plain[i]
            if row.cpu < need_cpu or row.mem < need_mem or not allowed[row.model] or row.largest < share or row.whole < gpus:
                if i in fits:   # a row out of ``fits`` has no key already
                    fits.remove(i)
                    key[i] = NONE
                continue
            fits.add(i)
            found = score(row)
            if found is None:   # no candidate whose GPU has the memory asked for (yet: see Best)
                key[i] = NONE
            else:
                key[i], index[i] = found

    def refresh(self, view: PoolScores, best: Best, rows: np.ndarray, res: WorkerResources) -> None:
        """``best`` on the feasible ``rows`` (sorted): per row, its least candidate by
        (keys, GPU index), as ``ranked`` orders a row's candidates."""
        if not rows.size:
            return
        arrays = view.arrays
        rows, gpu_index, after = candidates(arrays, rows, res, memory=True)
        if not rows.size:
            return
        radix = arrays.gpu.shape[1] + 1
        packed = self.packed(view, rows, after, growth(view.mix, view.u[rows], arrays, rows, after, res)) * radix \
            + (gpu_index + 1)
        if res.is_share:   # several candidates a row, grouped by row
            starts = np.flatnonzero(np.concatenate(([True], rows[1:] != rows[:-1])))
            rows, packed = rows[starts], np.minimum.reduceat(packed, starts)
        best.key[rows], best.gpu[rows] = np.divmod(packed, radix)
        best.gpu[rows] -= 1

    def rank(self, state: StateLike, statement: Statement, job: JobState, res: WorkerResources,
             nodes: Sequence[NodeState]) -> dict[str, int]:
        """A gang's nodes, each by its best candidate's place in ``choose``'s order."""
        if res.is_mig:
            return rank_mig(nodes, job.spec.pool, res)
        view = self.view(state, statement, job.spec.pool)
        view.sync()
        arrays = view.arrays
        rows = np.array([arrays.row[n.name] for n in nodes], dtype=np.int64)
        rows, _, best = self.ranked(view, rows, res)
        ranks: dict[str, int] = {}
        for i in best:
            ranks.setdefault(arrays.nodes[rows[i]].name, len(ranks))
        for n in nodes:   # the arrays' view of a node may differ from its capacity's: last
            ranks.setdefault(n.name, len(ranks))
        return ranks

    def ranked(self, view: PoolScores, rows: np.ndarray, res: WorkerResources):
        """(candidate rows, their GPU index, the candidates' indices best first) of ``res``
        on the feasible ``rows`` (``view`` synced)."""
        arrays = view.arrays
        rows, gpu_index, after = candidates(arrays, rows, res)
        keys = self.keys(view, rows, after, growth(view.mix, view.u[rows], arrays, rows, after, res))
        return rows, gpu_index, np.lexsort((gpu_index, rows, *reversed(keys)))

    def view(self, state: StateLike, statement: Statement, pool: str) -> PoolScores:
        key = (self.name, self.popularity, self.patience, pool)
        view = statement.views.get(key)
        if view is None:
            arrays = arrays_for(statement, state.nodes, pool)
            mix = pool_mix(state, statement, pool, self.popularity)
            scorer = kept_scorer(statement, key, mix, arrays.models, self.patience, self.lookahead)
            view = statement.views[key] = PoolScores(arrays, mix, self.patience, self.lookahead, scorer)
        return view

    def keys(self, view: PoolScores, rows: np.ndarray, after: np.ndarray, growth: np.ndarray) -> list[np.ndarray]:
        """Sort keys of the candidates, most significant first, lower better (then node
        registration order, then GPU index)."""
        return [fgd_score(growth)]

    def packed(self, view: PoolScores, rows: np.ndarray, after: np.ndarray, growth: np.ndarray) -> np.ndarray:
        """``keys`` as one integer each, in the same order (they are small integers)."""
        return fgd_score(growth).astype(np.int64) + 100


def take(node: NodeState, pool: str, res: WorkerResources, index: int) -> tuple[GpuSlot, ...] | None:
    """The slots of a scored candidate, checked on the node itself."""
    if node.info.pool != pool or not fits_node(node, res):
        return None
    if index < 0:
        return pick_gpus(node, res)
    if not res.allows(node.model) or not node.gpus[index].fits_share(res.gpu_milli, res.gpu_memory_mib):
        return None
    slots = _SHARE_SLOTS.get((index, res.gpu_milli))
    if slots is None:
        slots = _SHARE_SLOTS[(index, res.gpu_milli)] = (GpuSlot(index, res.gpu_milli),)
    return slots


# A share's slots by (GPU index, milli): frozen, so one tuple serves every decision that
# takes that much of that GPU (building the frozen dataclass was ~2 % of a cycle's
# decisions); at most a node's GPUs times the milli a share can ask for.
_SHARE_SLOTS: dict[tuple[int, int], tuple[GpuSlot, ...]] = {}


class FgdLookahead(Fgd):
    """Ours. FGD's score first; among the choices it scores alike (its integer score ties
    often), the one whose GPUs grow least in *expected final waste*, to the milli
    (``final_waste``: a look-ahead at how the typical tasks will fill what is left); then
    a node already in use before an idle one (idle nodes stay whole); then first fit."""

    name = "fgd-lookahead"
    lookahead = True

    def __init__(self, popularity: float = POPULARITY, patience: float = PATIENCE) -> None:
        super().__init__(popularity)
        if patience <= 0:
            raise ValueError(f"patience must be > 0, not {patience!r}")
        self.patience = patience

    def keys(self, view, rows, after, growth):
        waste = view.final_waste()
        growth_of_waste = (waste[after] - waste[view.arrays.gpu[rows]]).sum(axis=1)
        return [fgd_score(growth), np.round(growth_of_waste), view.arrays.idle[rows]]

    def packed(self, view, rows, after, growth):
        score, waste, idle = self.keys(view, rows, after, growth)
        bound = 1000 * after.shape[1]    # a GPU's expected final waste is within 0..1000
        return ((score.astype(np.int64) + 100) * (2 * bound + 1) + (waste.astype(np.int64) + bound)) * 2 + idle
