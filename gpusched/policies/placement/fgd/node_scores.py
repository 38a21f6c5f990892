"""FGD's scores of single nodes (rows of ``NodeArrays``) in plain Python, memoized by
what they depend on, bit for bit what ``fragmentation``'s numpy computes; and the scorer
kept between cycles while the task mix stays the same (``KeptScorer``).

A decision changes one node (a gang's, a few), and the next decision needs the scores of
just those nodes again; numpy's fixed cost per call (tens of calls per score) is then
far more than the arithmetic. So the nodes a decision touched are rescored here, one
at a time, and numpy stays for the many-node passes (``policy``).

The results are identical to the numpy path's to the last bit, which matters: FGD's
integer score rounds at exact ties (a growth of exactly 0 scores 50, one ulp more 49).
Every product and difference is the same IEEE operation numpy performs, in the same
order; sums over a row follow numpy's pairwise summation of a contiguous row
(``pairwise``); the exponential is numpy's own. Tests compare both paths on random rows.

A row's scores depend on the mix and the row alone, so while the mix stays the same
(jobs placed count as they did waiting; a submission or an end changes it) the row
scorer and its memos are kept too (``KeptScorer``): a cycle then scores for the first
time only the rows no earlier cycle scored.
"""
from __future__ import annotations

from bisect import bisect_left, bisect_right
from typing import Callable, Iterable, NamedTuple, Sequence
from weakref import WeakValueDictionary

import numpy as np

from gpusched.core.model import WorkerResources
from gpusched.policies.placement.fgd.fragmentation import MixArrays, Shape, compile_mix, fgd_score, final_waste
from gpusched.policies.placement.kept_index import KEPT, view
from gpusched.policies.statement import Statement

MAX_KINDS = 65_536   # row signatures a kept scorer memoizes before it starts over

# Blocks numpy's pairwise summation works in (``pairwise_sum`` in numpy's loops).
_UNROLL, _BLOCK = 8, 128


def pairwise(a: Sequence[float]) -> float:
    """numpy's sum of a contiguous float64 row (``a.sum()``), in its order."""
    n = len(a)
    if n < _UNROLL:
        total = 0.0
        for x in a:
            total += x
        return total
    if n <= _BLOCK:
        r = list(a[:_UNROLL])
        i = _UNROLL
        while i < n - n % _UNROLL:
            for j in range(_UNROLL):
                r[j] += a[i + j]
            i += _UNROLL
        total = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
        for x in a[i:]:
            total += x
        return total
    half = n // 2
    half -= half % _UNROLL
    return pairwise(a[:half]) + pairwise(a[half:])


class Signature(NamedTuple):
    """What a row's candidates' keys depend on but the CPU level after placing."""

    free: tuple[int, ...]    # free milli per GPU, ascending (U and the keys read the multiset)
    level: int               # the CPU level (``MixArrays.cpu_levels``) of the row's free CPU
    model: int
    idle: bool               # for fgd-lookahead's keys only (always False for FGD's)


class Row(NamedTuple):
    """One node as ``RowScorer`` reads it (from ``NodeArrays`` and the view's U)."""

    gpu: tuple[int, ...]     # free milli per GPU
    cpu: int
    mem: int
    model: int
    idle: bool
    u: float
    largest: int             # the largest free milli of one GPU
    whole: int               # free whole GPUs
    signature: Signature     # what a candidate's keys depend on but the CPU level after
    kind: int                # the signature's number (``RowScorer.row``): a cheaper memo key
    gmem: tuple[int, ...]    # free memory MiB per GPU (a share's GPU-memory request)


# A request's candidates on one row: (packed key, free milli of the GPU taken, or -1) by
# pair, least first, flat (key, free, key, free, ...): one object a memo entry, so the
# memos, thousands of entries a cycle, give the cyclic GC fewer allocations to count.
Found = tuple[int, ...]
# A request's scorer: the (packed key, GPU index) of a row's least candidate, or None
# when no candidate of the row has the GPU memory the request asks for.
Score = Callable[[Row], "tuple[int, ...] | None"]


def row_takes(res: WorkerResources, allowed: list[bool], memory: bool = True) -> Callable[[Row], bool]:
    """Whether a row has room for one worker of ``res`` (GPU memory aside; ``allowed``:
    per model, whether ``res`` accepts it), as ``NodeArrays.feasible`` decides it
    (``PoolScores.rescore`` checks the same inline); without ``memory``, host memory aside too."""
    need_cpu, need_mem, gpus = res.cpu_milli, res.memory_mib if memory else 0, res.gpus
    share = res.gpu_milli if res.is_share else 0
    return lambda row: (row.cpu >= need_cpu and row.mem >= need_mem and allowed[row.model]
                        and row.largest >= share and row.whole >= gpus)


def _flat(found: list[tuple[int, int]]) -> Found:
    """Candidates as ``Found``: least first, flat."""
    if len(found) == 1:
        return found[0]
    found.sort()
    return tuple(x for pair in found for x in pair)   # a tuple of ints: the cyclic GC stops tracking it


class RowScorer:
    """Scores one node's candidates under a mix (``fragmentation.MixArrays``)."""

    def __init__(self, mix: MixArrays, final_waste: Callable[[], np.ndarray], lookahead: bool) -> None:
        self.lookahead = lookahead                 # fgd-lookahead's keys, or FGD's
        self.milli: list[int] = mix.milli.tolist()       # per (milli, GPUs) combination
        self.count: list[int] = mix.count.tolist()
        self.levels: list[int] = mix.cpu_levels.tolist()
        # weight[model][level]: the combinations' weights, as usable() reads them
        self.weight: list[list[list[float]]] = mix.weight.transpose(1, 2, 0).tolist()
        self.final_waste = final_waste      # fgd-lookahead's, computed when first needed
        self._waste: list[float] | None = None
        self._score: dict[float, int] = {}
        self._usable: dict[tuple, float] = {}
        self._tallies: dict[tuple, tuple[tuple[int, ...], tuple[int, ...]]] = {}
        self._memo: dict[tuple[int, int], dict[object, Found]] = {}
        self._kinds: dict[Signature, int] = {}     # signature -> its number
        self._rows: dict[tuple, tuple[float, int, int, Signature, int]] = {}   # by (GPUs, CPU level, model, idle)
        # Weakly: the scorers refer to this object, which holding them would make a
        # reference cycle, left to the cyclic GC (each Best holds its scorer).
        self._requests: WeakValueDictionary[WorkerResources, Score] = WeakValueDictionary()

    def kinds(self) -> int:
        """Row signatures memoized: what the memos grow with."""
        return len(self._kinds)

    def tallies(self, gpu: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Per combination: how many GPUs are big enough, and their free milli. Kept by
        the exact GPUs (how rows ask) and by their multiset (what the tallies depend on)."""
        key = tuple(gpu)
        found = self._tallies.get(key)
        if found is None:
            ascending = tuple(sorted(key))
            found = self._tallies.get(ascending)
            if found is None:
                found = self._tallies[ascending] = self._count(ascending)
            self._tallies[key] = found
        return found

    def _count(self, ascending: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The tallies of GPUs sorted by free milli: those with ``f >= m`` are a suffix."""
        n = len(ascending)
        suffix = [0] * (n + 1)   # suffix[j]: the free milli of ascending[j:] (integers: exact)
        for j in range(n - 1, -1, -1):
            suffix[j] = suffix[j + 1] + ascending[j]
        cnt, room = [], []
        for m in self.milli:
            j = bisect_left(ascending, m)
            cnt.append(n - j)
            room.append(suffix[j])
        return tuple(cnt), tuple(room)   # tuples: the cyclic GC stops tracking them

    def usable(self, cnt: Sequence[int], room: Sequence[int], cpu: int, model: int) -> float:
        """``fragmentation.usable`` of one row from its tallies."""
        if not self.milli:
            return 0.0
        weight = self.weight[model][bisect_right(self.levels, cpu)]
        count = self.count
        return pairwise([w * r if c >= need else 0.0 for w, c, r, need in zip(weight, cnt, room, count)])

    def usable_row(self, gpu: tuple[int, ...], cpu: int, model: int) -> float:
        memo = (gpu, bisect_right(self.levels, cpu), model)
        u = self._usable.get(memo)
        if u is None:
            u = self._usable[memo] = self.usable(*self.tallies(gpu), cpu, model)
        return u

    def score(self, growth: float) -> int:
        """``fgd_score`` of one growth, plus 100 (0..100, lower better)."""
        s = self._score.get(growth)
        if s is None:
            s = self._score[growth] = 100 + int(fgd_score(growth))
        return s

    def row(self, gpu: tuple[int, ...], cpu: int, mem: int, model: int, idle: bool, gmem: tuple[int, ...]) -> Row:
        """The row, with its U (``usable_row``) and what its candidates' keys depend on
        but the CPU level after placing (``signature``): the free milli as a multiset
        (sorted), the CPU level, the model, and for fgd-lookahead whether it is idle."""
        level = bisect_right(self.levels, cpu)
        memo = (gpu, level, model, idle)
        known = self._rows.get(memo)
        if known is None:
            ascending = tuple(sorted(gpu))   # U and the keys depend on the multiset only
            signature = Signature(ascending, level, model, idle and self.lookahead)
            kind = self._kinds.setdefault(signature, len(self._kinds))
            known = self._rows[memo] = (self.usable_row(ascending, cpu, model), max(gpu, default=0),
                                        gpu.count(1000), signature, kind)
        u, largest, whole, signature, kind = known
        return Row(gpu, cpu, mem, model, idle, u, largest, whole, signature, kind, gmem)

    def scorer(self, res: WorkerResources) -> Score:
        """``res``'s scorer of rows that take it (checked by the caller, GPU memory
        aside): the row's least candidate by (keys, GPU index), the keys packed as
        ``policy.Fgd.packed`` / ``policy.FgdLookahead.packed`` pack them.

        Candidates are kept by row signature and CPU level after placing, so nodes alike
        share the work. The keys do not depend on the order of the GPUs (sums whose terms
        are all zero but one are exact in any order), except fgd-lookahead's for several
        whole GPUs: those are kept by the exact GPUs. A share's GPU index is found on the
        row: the lowest GPU with the candidate's free milli, as ``candidates`` takes it
        (a candidate whose GPU lacks the memory asked for is no candidate)."""
        score = self._requests.get(res)
        if score is None:
            score = self._requests[res] = self._scorer(res)
        return score

    def _scorer(self, res: WorkerResources) -> Score:
        form = (res.gpus, res.gpu_milli)
        memo = self._memo.get(form)
        if memo is None:
            memo = self._memo[form] = {}
        levels, need_cpu, candidates = self.levels, res.cpu_milli, self._candidates

        if self.lookahead and res.gpus > 1:
            def found_of(row: Row) -> Found:
                at = (row.gpu, row.signature, bisect_right(levels, row.cpu - need_cpu))
                found = memo.get(at)
                if found is None:
                    found = memo[at] = candidates(row, res)
                return found
        else:
            # One int a key (no tuple to build, hash, and keep for the cyclic GC to scan).
            stride = len(levels) + 1

            def found_of(row: Row) -> Found:
                at = row.kind * stride + bisect_right(levels, row.cpu - need_cpu)
                found = memo.get(at)
                if found is None:
                    found = memo[at] = candidates(row, res)
                return found

        if not res.is_share:
            return found_of     # one candidate: (key, -1)
        need_mem = res.gpu_memory_mib

        def share(row: Row) -> tuple[int, int] | None:
            found, gpu = found_of(row), row.gpu
            if need_mem:   # candidates whose GPU has the memory asked for
                gmem = row.gmem
                found = tuple(x for j in range(0, len(found), 2) if gmem[gpu.index(found[j + 1])] >= need_mem
                              for x in found[j:j + 2])
                if not found:
                    return None
            low = found[0]
            if len(found) == 2 or found[2] != low:
                return low, gpu.index(found[1])
            return low, min(gpu.index(found[j + 1]) for j in range(0, len(found), 2) if found[j] == low)
        return share

    def _candidates(self, row: Row, res: WorkerResources) -> Found:
        """(packed key, free milli of the GPU taken, or -1) of each candidate, least first.
        A candidate's U after placing comes from the row's tallies and the GPUs it
        changes, term by term as ``usable`` computes it."""
        gpu, cpu, model, idle, u = row.gpu, row.cpu, row.model, row.idle, row.u
        cnt, room = self.tallies(gpu)
        weight = self.weight[model][bisect_right(self.levels, cpu - res.cpu_milli)] if self.milli else ()
        if not self.lookahead:   # FGD's keys: the score alone (no waste, no closure to build)
            return self._fgd_candidates(row, res, weight, cnt, room)
        waste = self.waste()
        bound = 1000 * len(gpu)
        found: list[tuple[int, int]] = []
        if res.is_share:
            share = res.gpu_milli
            parts = tuple(zip(weight, cnt, room, self.count, self.milli))
            for f, terms in self._share_terms(parts, [f for f in set(gpu) if f >= share], share):
                found.append((self._key(u - pairwise(terms) - share, waste, bound, idle,
                                        lambda: waste[f - share] - waste[f]), f))
        elif res.gpus:   # the lowest-index free GPUs, each from 1000 free to 0
            n = res.gpus
            taken = 1000 * n
            terms = [w * (r - taken) if c - n >= need else 0.0 for w, c, r, need in zip(weight, cnt, room, self.count)]
            found.append((self._key(u - pairwise(terms) - taken, waste, bound, idle,
                                    lambda: self._whole_waste(gpu, n, waste)), -1))
        else:   # U after is U at the CPU level after: the memo's, shared by rows alike
            after = self.usable_row(row.signature.free, cpu - res.cpu_milli, model)
            found.append((self._key(u - after, waste, bound, idle, lambda: 0.0), -1))
        return _flat(found)

    def _fgd_candidates(self, row: Row, res: WorkerResources, weight: Sequence[float], cnt: Sequence[int],
                        room: Sequence[int]) -> Found:
        """``_candidates`` with FGD's keys (``score`` of the growth), the same numbers."""
        u, score = row.u, self.score
        if res.is_share:
            share = res.gpu_milli
            parts = tuple(zip(weight, cnt, room, self.count, self.milli))
            return _flat([(score(u - pairwise(terms) - share), f)
                          for f, terms in self._share_terms(parts, [f for f in set(row.gpu) if f >= share], share)])
        if res.gpus:   # the lowest-index free GPUs, each from 1000 free to 0
            n = res.gpus
            taken = 1000 * n
            terms = [w * (r - taken) if c - n >= need else 0.0 for w, c, r, need in zip(weight, cnt, room, self.count)]
            return score(u - pairwise(terms) - taken), -1
        # U after is U at the CPU level after: the memo's, shared by rows alike
        return score(u - self.usable_row(row.signature.free, row.cpu - res.cpu_milli, row.model)), -1

    def _share_terms(self, parts: tuple, frees: list[int], share: int):
        """Per free amount ``f`` a share can take, the terms of ``usable`` after it takes
        ``share`` of a GPU with ``f`` free (``g`` left): a combination of ``m`` milli
        counts that GPU before if ``f >= m`` and after if ``g >= m``. The combinations are
        sorted by milli, so those with ``m <= g`` (before and after), ``g < m <= f``
        (before only) and ``f < m`` (neither) are three runs; the first and last runs'
        terms do not depend on ``f`` and are computed once for the row. Each term is the
        same float operation as ``w * (r - [f >= m] f + [g >= m] g)``."""
        if len(frees) == 1:   # nothing to share between free amounts
            f = frees[0]
            g = f - share
            yield f, [w * (r - (f if f >= m else 0) + (g if g >= m else 0))
                      if c - (f >= m) + (g >= m) >= need else 0.0 for w, c, r, need, m in parts]
            return
        both = [w * (r - share) if c >= need else 0.0 for w, c, r, need, m in parts]
        neither = [w * r if c >= need else 0.0 for w, c, r, need, m in parts]
        milli = self.milli
        for f in frees:
            low, high = bisect_right(milli, f - share), bisect_right(milli, f)
            yield f, (both[:low] + [w * (r - f) if c > need else 0.0 for w, c, r, need, m in parts[low:high]]
                      + neither[high:])

    def _key(self, growth: float, waste, bound: int, idle: bool, waste_growth: Callable[[], float]) -> int:
        key = self.score(growth)
        if waste is None:
            return key
        return (key * (2 * bound + 1) + round(waste_growth()) + bound) * 2 + idle

    @staticmethod
    def _whole_waste(gpu: tuple[int, ...], n: int, waste: list[float]) -> float:
        """The growth of expected final waste of taking the first ``n`` free GPUs, summed
        over the row's GPUs as numpy sums it (positions matter to the rounding)."""
        terms = [0.0] * len(gpu)
        for j in [j for j, f in enumerate(gpu) if f == 1000][:n]:
            terms[j] = waste[0] - waste[1000]
        return pairwise(terms)

    def waste(self) -> list[float]:
        if self._waste is None:
            self._waste = self.final_waste().tolist()
        return self._waste


class WasteTable:
    """``fragmentation.final_waste`` of one mix, computed when first asked."""

    __slots__ = ("shapes", "patience", "_table")

    def __init__(self, shapes: dict[Shape, float], patience: float) -> None:
        self.shapes, self.patience = shapes, patience
        self._table: np.ndarray | None = None

    def __call__(self) -> np.ndarray:
        if self._table is None:
            self._table = final_waste(self.shapes, self.patience)
        return self._table


class KeptScorer:
    """FGD's row scorer of one policy and pool, kept between cycles while its mix, the
    pool's models, patience and keys stay the same (a statement view, as
    ``task_mix.KeptMix``)."""

    __slots__ = ("shapes", "models", "scorer")

    def __init__(self) -> None:
        self.shapes: list[tuple[Shape, float]] = []
        self.models: list[str] = []
        self.scorer: RowScorer | None = None

    def touch(self, names: Iterable[str]) -> None:
        """Bookings change rows, not how a row scores."""

    def renew(self, names: Iterable[str]) -> None:
        """Nor do registrations: the pool's models are compared at ``scorer_for``."""

    def scorer_for(self, mix: dict[Shape, float], models: list[str], patience: float, lookahead: bool) -> RowScorer:
        # The mix in order: the waste table and compiled weights sum in it.
        shapes = list(mix.items())
        scorer = self.scorer
        if scorer is None or shapes != self.shapes or models != self.models or scorer.kinds() > MAX_KINDS:
            scorer = self.scorer = RowScorer(compile_mix(mix, models), WasteTable(mix, patience), lookahead)
            self.shapes, self.models = shapes, list(models)
        return scorer


def kept_scorer(statement: Statement, key: tuple, mix: dict[Shape, float], models: list[str], patience: float,
                lookahead: bool) -> RowScorer | None:
    """The scorer kept for ``key`` (the policy's view key) in a cycle that keeps its
    indexes, None in one that keeps nothing."""
    if KEPT not in statement.views:
        return None
    kept = view(statement, ("fgd-scorer", *key), KeptScorer)
    return kept.scorer_for(mix, models, patience, lookahead)   # type: ignore[attr-defined]
