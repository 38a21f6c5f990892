"""FGD's scores of one pool's nodes in one cycle (``PoolScores``): every node's usable
capacity ``U`` (``fragmentation.usable``) under the cycle's task mix, and each recent
request's best candidate on every node (``Best``), true as the cycle's statement books.

How it stays cheap: the statement tells the view which nodes it changes (``touch``);
only those are recomputed, when next asked, and in plain Python (``node_scores``, bit
for bit the numpy numbers) since they are few. A request asked for the first time scores
one node of each group of equal nodes (equal free milli per GPU, CPU, model, idleness;
free host memory, which no score reads, is checked node by node).
"""
from __future__ import annotations

from dataclasses import dataclass
from operator import gt
from typing import Iterable, NamedTuple

import numpy as np

from gpusched.policies.placement.arrays import NodeArrays
from gpusched.policies.placement.fgd.fragmentation import PATIENCE, Shape, compile_mix, usable
from gpusched.policies.placement.fgd.node_scores import Row, RowScorer, Score, WasteTable


class PoolScores:
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
