"""The numbers FGD scores with, per pool and cycle: the typical tasks' mix compiled to
arrays (``compile_mix``), every node's usable capacity ``U`` (``usable``), fgd-lookahead's
expected final waste (``final_waste``), and ``FragView``, which keeps them, and each
recent request's best candidate on every node, true as the cycle's statement books.

How it stays cheap: the statement tells the view which nodes it changes (``touch``);
only those are recomputed, when next asked, and in plain Python (``frag_rows``, bit for
bit the numpy numbers) since they are few. A request asked for the first time scores
one node of each group of equal nodes (equal free milli per GPU, CPU, model, idleness;
free host memory, which no score reads, is checked node by node).
"""
from __future__ import annotations

from bisect import bisect_right
from collections import Counter
from dataclasses import dataclass
from operator import gt
from typing import Iterable

import numpy as np

from gpusched.policies.placement.arrays import NodeArrays
from gpusched.policies.placement.frag_rows import Row, RowScorer, Score

PATIENCE = 0.1       # fgd-lookahead: how soon a GPU stops getting tasks (final_waste)
Shape = tuple[int, int, int, tuple[str, ...]]    # (CPU milli, milli per GPU, GPUs, models)


@dataclass(slots=True)
class Compiled:
    """The typical shapes as arrays over one pool's models and CPU thresholds."""

    milli: np.ndarray      # (K,) milli per GPU of each (milli, GPUs) combination
    count: np.ndarray      # (K,) GPUs it needs
    cpu_levels: np.ndarray # sorted distinct CPU requests
    weight: np.ndarray     # (K, models, levels+1): sum of p_t over shapes t of the combination
                           # the model accepts with CPU request <= the level's


def compile_mix(mix: dict[Shape, float], models: list[str]) -> Compiled:
    gpu_shapes = [(s, p) for s, p in mix.items() if s[2]]
    combos = sorted({(s[1], s[2]) for s, _ in gpu_shapes})
    levels = np.array(sorted({s[0] for s, _ in gpu_shapes}), dtype=np.int64)
    weight = np.zeros((len(combos), len(models), len(levels) + 1))
    where = {c: i for i, c in enumerate(combos)}
    for (cpu, milli, gpus, allowed), p in gpu_shapes:
        level = int(np.searchsorted(levels, cpu, side="right"))
        for m, model in enumerate(models):
            if not allowed or model in allowed:
                weight[where[(milli, gpus)], m, level:] += p
    return Compiled(np.array([c[0] for c in combos], dtype=np.int64),
                    np.array([c[1] for c in combos], dtype=np.int64), levels, weight)


def usable(mix: Compiled, gpu: np.ndarray, cpu: np.ndarray, model: np.ndarray) -> np.ndarray:
    """U per row: free milli typical GPU tasks could use, weighted by their frequency."""
    if not mix.milli.size:
        return np.zeros(len(cpu))
    big = gpu[:, None, :] >= mix.milli[None, :, None]                  # rows, combos, GPUs
    room = (gpu[:, None, :] * big).sum(axis=2)
    fits = big.sum(axis=2) >= mix.count[None, :]
    level = np.searchsorted(mix.cpu_levels, cpu, side="right")
    weight = mix.weight[:, model, level].T                             # rows, combos
    return (weight * fits * room).sum(axis=1)


class FragView:
    """``U`` of every node of a pool under the cycle's task mix, kept up to date, and each
    recent request's best candidate on every node (``best``), also kept up to date.

    The statement tells the view which nodes it changes (``touch``); what depends on a
    node alone is recomputed for those nodes only, when next asked: ``U`` (``sync``),
    and a request's per-node best (``Best``, refreshed from the ``changed`` rows)."""

    def __init__(self, arrays: NodeArrays, mix: dict[Shape, float], patience: float = PATIENCE,
                 lookahead: bool = False, scorer: RowScorer | None = None) -> None:
        self.arrays = arrays
        self.lookahead = lookahead   # whose keys ``scorer`` packs: fgd-lookahead's, or FGD's
        self.shapes = mix
        self.patience = patience
        self.mix = compile_mix(mix, arrays.models)
        # Rows alike in what a score reads (free milli per GPU, CPU, model, idleness) at
        # the start: ``Fgd.fill`` scores one row of each group, and U, a row's own
        # function, is computed on one row of each group.
        self.group = _groups(arrays.gpu, arrays.cpu, arrays.model, arrays.idle)
        first = _firsts(self.group)
        self.u = usable(self.mix, arrays.gpu[first], arrays.cpu[first], arrays.model[first])[self.group]
        # Shared with the row scorer: neither refers to the other, so no reference cycle
        # keeps a cycle's view (its memos, thousands of objects) for the cyclic GC to find;
        # it is freed when the statement drops it.
        # A scorer kept from an earlier cycle (``frag_mix.kept_scorer``: same mix, models,
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
        plain-Python copy of the changed rows that ``Fgd.rescore`` reads."""
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
            was = plain.get(i) or initial[i]
            row = plain[i] = scorer.row(gpu, cpu, mem, model[i], idle, gmem)   # its U: bit for bit numpy's
            if one_by_one:   # numpy's cost is per call: one element at a time for a few rows
                u[i] = row.u
                moved[i] = True
                stamp[i] = place
                place += 1
            # Capacity that grew (CPU, memory, a GPU's free milli or memory) may let a
            # request fit where it did not.
            if cpu > was[1] or mem > was[2] or any(map(gt, gpu, was[0])) or any(map(gt, gmem, was[-1])):
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
    need: tuple            # what a row needs to take the request: (CPU, memory, largest free
                           # milli of one GPU, free whole GPUs, per model whether it is accepted)


class WasteTable:
    """``final_waste`` of one mix, computed when first asked."""

    __slots__ = ("shapes", "patience", "_table")

    def __init__(self, shapes: dict[Shape, float], patience: float) -> None:
        self.shapes, self.patience = shapes, patience
        self._table: np.ndarray | None = None

    def __call__(self) -> np.ndarray:
        if self._table is None:
            self._table = final_waste(self.shapes, self.patience)
        return self._table


NONE = np.iinfo(np.int64).max
FEW_ROWS = 256            # changed rows rescored one by one in Python (frag_rows); more: numpy
CACHED_REQUESTS = 256    # distinct requests a view keeps the per-node best of
LONG_GAP = 128            # changes since a Best last looked, past which ``since`` asks numpy


def final_waste(mix: dict[Shape, float], patience: float = PATIENCE) -> np.ndarray:
    """``w[f]``, f = 0..1000: the free milli a GPU with ``f`` free is expected to be left
    with. Typical tasks arrive in proportion to their frequency ``p``; one that fits (a
    share of ``s <= f`` milli; a whole-GPU task when the GPU is free) lands and leaves
    ``f - s``; meanwhile the GPU stops getting tasks at rate ``patience`` (the run ends,
    or other GPUs take them), so ``w[f] = (patience * f + sum p * w[f - s]) /
    (patience + sum p)`` over the tasks that fit. A 190-milli hole that only rare small
    tasks fit is expected to stay nearly empty; a 530 hole that a common 470 fills, not."""
    shares: Counter[int] = Counter()
    whole = 0.0
    for (_, milli, gpus, _), p in mix.items():
        if gpus == 1 and milli < 1000:
            shares[milli] += p
        elif gpus:
            whole += p
    sizes = np.array(sorted(shares), dtype=np.int64)
    p = np.array([shares[s] for s in sizes])
    # What depends on the shares that fit alone, once per count k of them (sizes[:k]):
    # their frequencies, and the sum of those, each the very numpy operation it was when
    # computed anew for each f; and the free milli each leaves of every f.
    heads = [(p[:k], p[:k].sum()) for k in range(len(sizes) + 1)]
    left = np.arange(1001)[:, None] - sizes[None, :]
    bounds = sizes.tolist()
    w = np.zeros(1001)
    for f in range(1, 1001):
        k = bisect_right(bounds, f)     # shares that fit: sizes[:k]
        fit, reach = heads[k]
        if f == 1000:
            reach = reach + whole
        w[f] = (patience * f + fit @ w[left[f, :k]]) / (patience + reach)
    return w
