"""FGD's scores of one pool's nodes in one cycle (``PoolScores``): every node's usable
capacity ``U`` (``fragmentation.usable``) under the cycle's task mix, and each recent
request's best candidate on every node (``Best``), true as the cycle's statement books;
a request's decision (``first``) is the first node, in registration order, of the least
key, the one ranking every candidate by the policy's keys gives (``policy.Fgd.ranked``).

How it stays cheap: the statement tells the view which nodes it changes (``touch``);
only those are recomputed, when next asked, and in plain Python (``node_scores``, bit
for bit the numpy numbers) since they are few. A request asked for the first time scores
one node of each group of equal nodes (equal free milli per GPU, CPU, model, idleness;
free host memory, which no score reads, is checked node by node).
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from operator import attrgetter, gt
from typing import Callable, Iterable, NamedTuple

import numpy as np

from gpusched.core.model import WorkerResources
from gpusched.policies.placement.arrays import NodeArrays
from gpusched.policies.placement.fgd.fragmentation import PATIENCE, Shape, candidates, compile_mix, growth, usable
from gpusched.policies.placement.fgd.node_scores import Row, RowScorer, Score, WasteTable

# Every field of a request: the key of its ``Best``.
_FIELDS = attrgetter(*(f.name for f in fields(WorkerResources)))
# A policy's ``packed``: (view, rows, free milli per GPU after, growth) -> one sort key a candidate.
Packed = Callable[["PoolScores", np.ndarray, np.ndarray, np.ndarray], np.ndarray]


class PoolScores:
    """``U`` of every node of a pool under the cycle's task mix, kept up to date, and each
    recent request's best candidate on every node (``best``), also kept up to date.

    The statement tells the view which nodes it changes (``touch``); what depends on a
    node alone is recomputed for those nodes only, when next asked: ``U`` (``sync``),
    and a request's per-node best (``Best``, refreshed from the ``changed`` rows)."""

    def __init__(self, arrays: NodeArrays, mix: dict[Shape, float], packed: Packed, patience: float = PATIENCE,
                 lookahead: bool = False, scorer: RowScorer | None = None) -> None:
        self.arrays = arrays
        self.packed = packed         # the policy's sort keys of candidates, one integer each
        self.lookahead = lookahead   # whose keys ``scorer`` packs: fgd-lookahead's, or FGD's
        self.shapes = mix
        self.patience = patience
        self.mix = compile_mix(mix, arrays.models)
        # Rows alike in what a score reads (free milli per GPU, CPU, model, idleness) at
        # the start: ``fill`` scores one row of each group, and U, a row's own
        # function, is computed on one row of each group.
        self.group = _groups(arrays.gpu, arrays.cpu, arrays.model, arrays.idle)
        first = _firsts(self.group)
        self.u = usable(self.mix, arrays.gpu[first], arrays.cpu[first], arrays.model[first])[self.group]
        # Shared with the row scorer: neither refers to the other, so no reference cycle
        # keeps a cycle's view (its memos, thousands of objects) for the cyclic GC to find;
        # it is freed when the statement drops it.
        # A scorer kept from an earlier cycle (``node_scores.kept_scorer``: same mix, models,
        # patience and keys) brings its memos and its waste table.
        self._waste = scorer.final_waste if scorer is not None else WasteTable(mix, patience)
        self.stale: set[int] = set()          # rows changed since the last ``sync``
        # Every row change in order (what a Best has seen is a length of it), and the
        # changes that gained capacity (CPU, memory, a GPU's free milli or memory): only
        # those can start to fit. Lists, so a Best catches up with set operations in C.
        self.changed: list[int] = []
        self.grew: list[int] = []
        # Per row, its last place in ``changed`` (-1: none): the rows changed since a
        # place, distinct, in one numpy call (``since``), for a Best that saw many changes ago.
        self.stamp = np.full(len(arrays.nodes), -1, dtype=np.int64)
        self.initial = list(arrays.plain)     # (GPUs, CPU, memory, idle, GPU memory) before any change
        self.best: dict[tuple, Best] = {}   # by the request's fields, oldest first
        self._scorer: RowScorer | None = scorer
        self.plain: dict[int, Row] = {}   # changed rows as plain Python values
        self.moved = np.zeros(len(arrays.nodes), dtype=bool)   # changed since the view was built
        self.models: list[int] = arrays.model.tolist()
        self._memory_group: np.ndarray | None = None
        self._representatives: dict[bool, list[Row]] = {}

    @property
    def memory_group(self) -> np.ndarray:
        """``group`` for shares that ask for GPU memory: rows alike in free GPU memory too."""
        if self._memory_group is None:
            a = self.arrays
            self._memory_group = _groups(a.gpu, a.gmem, a.cpu, a.model, a.idle)
        return self._memory_group

    def representatives(self, memory: bool = False) -> list[Row]:
        """One row of each group (``group``, or ``memory_group``), by group number, on
        its values when the view was built."""
        reps = self._representatives.get(memory)
        if reps is None:
            first = _firsts(self.memory_group if memory else self.group).tolist()
            row = self.scorer.row
            reps = self._representatives[memory] = [
                row(gpu, cpu, mem, self.models[i], idle, gmem)
                for i in first for gpu, cpu, mem, idle, gmem in (self.initial[i],)]
        return reps

    def final_waste(self) -> np.ndarray:
        return self._waste()

    def touch(self, names: Iterable[str]) -> None:
        for name in names:
            i = self.arrays.row.get(name)
            if i is not None:
                self.stale.add(i)

    def sync(self) -> None:
        """Bring ``U`` up to date (each row's U depends on that row alone), and the
        plain-Python copy of the changed rows that ``rescore`` reads."""
        if not self.stale:
            return
        a = self.arrays
        rows = sorted(self.stale)
        self.stale.clear()
        if len(rows) > FEW_ROWS:
            at = np.array(rows, dtype=np.int64)
            self.u[at] = usable(self.mix, a.gpu[at], a.cpu[at], a.model[at])
        scorer, u, moved, model, plain, initial = self.scorer, self.u, self.moved, self.models, self.plain, self.initial
        one_by_one = len(rows) <= FEW_ROWS
        grew, stamp, place = self.grew, self.stamp, len(self.changed)
        self.changed += rows
        if not one_by_one:
            stamp[rows] = np.arange(place, place + len(rows))
        for i in rows:
            gpu, cpu, mem, idle, gmem = a.plain[i]
            # Its values when last synced (a ``Row``) or when the view was built (``NodeArrays.plain``).
            was_gpu, was_cpu, was_mem, *_, was_gmem = plain.get(i) or initial[i]
            row = plain[i] = scorer.row(gpu, cpu, mem, model[i], idle, gmem)   # its U: bit for bit numpy's
            if one_by_one:   # numpy's cost is per call: one element at a time for a few rows
                u[i] = row.u
                moved[i] = True
                stamp[i] = place
                place += 1
            # Capacity that grew (CPU, memory, a GPU's free milli or memory) may let a
            # request fit where it did not.
            if cpu > was_cpu or mem > was_mem or any(map(gt, gpu, was_gpu)) or any(map(gt, gmem, was_gmem)):
                grew.append(i)
        if not one_by_one:
            moved[rows] = True

    def since(self, seen: int) -> list[int]:
        """The rows in ``changed[seen:]`` (in any order, maybe repeated)."""
        if len(self.changed) - seen <= LONG_GAP:   # the slice itself: cheaper than a numpy call
            return self.changed[seen:]
        return np.flatnonzero(self.stamp >= seen).tolist()

    @property
    def scorer(self) -> RowScorer:
        if self._scorer is None:
            self._scorer = RowScorer(self.mix, self._waste, self.lookahead)
        return self._scorer

    def first(self, res: WorkerResources) -> tuple[int, int] | None:
        """(row, GPU index) of the first candidate in ``policy.Fgd.ranked``'s order over every
        feasible row, or None: from each node's best candidate, kept per request and
        recomputed only for the nodes changed since it was last asked."""
        self.sync()
        request = _FIELDS(res)   # hashed and compared in C, not by the dataclass's methods
        best = self.best.get(request)
        if best is None:
            if len(self.best) >= CACHED_REQUESTS:
                del self.best[next(iter(self.best))]   # the oldest
            count = len(self.arrays.nodes)
            need = Need(res.cpu_milli, res.memory_mib, res.gpu_milli if res.is_share else 0, res.gpus,
                        self.arrays.allowed_models(res))
            best = self.best[request] = Best(len(self.changed), len(self.grew), np.full(count, NONE, dtype=np.int64),
                                             np.zeros(count, np.int64), set(), self.scorer.scorer(res), need)
            best.fits.update(self.fill(best, res))
        elif best.seen < len(self.changed):
            self.catch_up(best, res)
        if not best.key.size:        # a pool without nodes
            return None
        i = int(best.key.argmin())   # the first row of the least key: registration order
        return None if best.key.item(i) == NONE else (i, best.gpu.item(i))   # item: a Python int

    def catch_up(self, best: Best, res: WorkerResources) -> None:
        """Rescore the rows changed since ``best`` last saw the view: those that fitted,
        and those that grew (capacity that only shrank cannot make a node fit; GPU memory
        aside, which ``Best.fits`` leaves aside)."""
        fits, changed, grew = best.fits, self.changed, self.grew
        rows = fits.intersection(self.since(best.seen))
        if best.grown < len(grew):
            rows.update(grew[best.grown:])
        best.seen, best.grown = len(changed), len(grew)
        if len(rows) <= FEW_ROWS:
            self.rescore(best, rows, res)
            return
        at = np.array(sorted(rows), dtype=np.int64)
        best.key[at] = NONE
        feasible = self.arrays.feasible(res, at)
        self.refresh(best, feasible, res)
        fits.difference_update(rows)
        fits.update(feasible.tolist())

    def fill(self, best: Best, res: WorkerResources) -> list[int]:
        """``best`` of a request asked for the first time in the cycle: rows that have
        not changed since the view was built score alike within a group of equal rows,
        so one row of each group is scored, on its values when the view was built (in
        plain Python when the groups are few); the changed ones are scored one by one.
        Returns the feasible rows but the changed ones ``rescore`` added to ``fits``."""
        if not len(self.moved):   # a pool without nodes
            return []
        memory = bool(res.is_share and res.gpu_memory_mib)
        reps = self.representatives(memory)
        if len(reps) > FEW_ROWS:
            return self.fill_numpy(best, res, memory).tolist()
        fits = self.fill_groups(best, reps, res, memory)
        changed = list(self.plain)   # the rows changed since the view was built
        if len(changed) > FEW_ROWS:
            at = self.arrays.feasible(res, np.array(sorted(changed), dtype=np.int64))
            self.refresh(best, at, res)
            return fits + at.tolist()
        self.rescore(best, changed, res)
        return fits

    def fill_groups(self, best: Best, reps: list[Row], res: WorkerResources,
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
        group = np.where(self.moved, len(reps), self.memory_group if memory else self.group)
        ok = taken[group] & (self.arrays.mem >= res.memory_mib)
        best.key[:], best.gpu[:] = np.where(ok, key[group], NONE), gpu[group]
        return np.flatnonzero(ok).tolist()

    def fill_numpy(self, best: Best, res: WorkerResources, memory: bool) -> np.ndarray:
        """``fill`` with numpy, one row of each group at once (many groups)."""
        rows = self.arrays.feasible(res)
        moved = self.moved[rows]
        fresh = rows[~moved]
        if fresh.size:
            group = self.memory_group if memory else self.group
            _, first, inverse = np.unique(group[fresh], return_index=True, return_inverse=True)
            scored = fresh[first]
            self.refresh(best, scored, res)
            best.key[fresh] = best.key[scored][inverse]
            best.gpu[fresh] = best.gpu[scored][inverse]
        changed = rows[moved]
        if changed.size > FEW_ROWS:
            self.refresh(best, changed, res)
        elif changed.size:
            self.rescore(best, changed.tolist(), res)
        return rows

    def rescore(self, best: Best, rows: Iterable[int], res: WorkerResources) -> None:
        """``refresh`` of a few changed rows, one by one (``node_scores``: the same numbers)."""
        plain, key, index, fits, score = self.plain, best.key, best.gpu, best.fits, best.score
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

    def refresh(self, best: Best, rows: np.ndarray, res: WorkerResources) -> None:
        """``best`` on the feasible ``rows`` (sorted): per row, its least candidate by
        (keys, GPU index), as ``policy.Fgd.ranked`` orders a row's candidates."""
        if not rows.size:
            return
        arrays = self.arrays
        rows, gpu_index, after = candidates(arrays, rows, res, memory=True)
        if not rows.size:
            return
        radix = arrays.gpu.shape[1] + 1
        packed = self.packed(self, rows, after, growth(self.mix, self.u[rows], arrays, rows, after, res)) * radix \
            + (gpu_index + 1)
        if res.is_share:   # several candidates a row, grouped by row
            starts = np.flatnonzero(np.concatenate(([True], rows[1:] != rows[:-1])))
            rows, packed = rows[starts], np.minimum.reduceat(packed, starts)
        best.key[rows], best.gpu[rows] = np.divmod(packed, radix)
        best.gpu[rows] -= 1


def _groups(*columns: np.ndarray) -> np.ndarray:
    """Each row's group number: rows equal in every column share one, numbered in the
    order of their first rows (a dict of the rows' values: numpy's ``unique`` over rows
    sorts them, many times slower at a pool's size)."""
    number: dict[tuple, int] = {}
    rows = map(tuple, np.column_stack(columns).tolist())
    return np.array([number.setdefault(row, len(number)) for row in rows], dtype=np.int64)


def _firsts(group: np.ndarray) -> np.ndarray:
    """The first row of each group, by group number."""
    return np.unique(group, return_index=True)[1]


@dataclass(slots=True)
class Best:
    """One request's best candidate on each node: its packed sort key (``NONE`` where
    the node cannot take it) and GPU index. Capacity that only shrank cannot make a
    node fit, so of the rows changed since, only those that fitted, or grew, are
    scored again. GPU memory is the exception: a share's candidate on a free amount is
    the lowest GPU with that much free, which may lack the memory while a later GPU with
    as much free has it; once the first fills further, the later one is the candidate.
    So ``fits`` leaves GPU memory aside (the rows that take the request but for it)."""

    seen: int              # entries of the view's ``changed`` seen
    grown: int             # entries of the view's ``grew`` seen
    key: np.ndarray
    gpu: np.ndarray
    fits: set[int]         # rows that take the request, GPU memory aside
    score: Score           # the request's scorer of one row (``RowScorer.scorer``)
    need: Need             # what a row needs to take the request


class Need(NamedTuple):
    """What a row needs to take a request (``node_scores.row_takes``, inline)."""

    cpu: int               # free CPU milli
    mem: int               # free host memory MiB
    share: int             # free milli of one GPU (0: not a share)
    gpus: int              # free whole GPUs
    allowed: list[bool]    # per model of the pool, whether the request accepts it


NONE = np.iinfo(np.int64).max
FEW_ROWS = 256            # changed rows rescored one by one in Python (node_scores); more: numpy
CACHED_REQUESTS = 256    # distinct requests a view keeps the per-node best of
LONG_GAP = 128            # changes since a Best last looked, past which ``since`` asks numpy
