"""Fragmentation-aware placement: FGD (Weng et al., "Beware of Fragmentation", ATC'23)
and ``fgd-lookahead``, ours: FGD with a look-ahead at the waste it leaves behind.

A node's *fragmentation* is the free GPU capacity the pool's typical tasks could not use
there, averaged over those tasks by how often they occur (``typical_shapes``): for a task shape
that fits the node (model, CPU, and enough GPUs with room), the free milli of the GPUs
too small for it; for one that does not fit, all of the node's free GPU milli. FGD puts
each worker where that fragmentation grows least (for a GPU share, also on the GPU where
it grows least). As in the reference simulator, the growth is scored as an integer
``floor(100 * sigmoid(-growth / 1000))``, so close calls tie and go to the node
registered first: fragmentation first, then first-fit packing.

Computed for every node at once with numpy (``FragView``): a node's *usable* capacity
``U = sum over typical shapes t of p_t * [t fits] * (free milli of GPUs big enough for t)``
is kept per node, so fragmentation is ``free milli - U`` and a candidate's growth is
``U(before) - U(after) - request``.
"""
from __future__ import annotations

from collections import Counter
from operator import gt
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import numpy as np

from gpusched.core.model import GpuSlot, WorkerResources
from gpusched.core.state import JobState, NodeState
from gpusched.policies.statement import Statement
from gpusched.policies.gpu_fit import StateLike, fits_node, pick_gpus
from gpusched.policies.placement.gang import Choice
from gpusched.policies.placement.arrays import NodeArrays, arrays_for
from gpusched.policies.placement.frag_rows import Row, RowScorer
from gpusched.policies.placement.heuristics import choose_mig, rank_mig

# Defaults of the policies' arguments (``Fgd(popularity=...)``, ``FgdLookahead(patience=...)``).
POPULARITY = 0.95    # the most frequent shapes covering this share of tasks are "typical"
PATIENCE = 0.1       # fgd-lookahead: how soon a GPU stops getting tasks (final_waste)
Shape = tuple[int, int, int, tuple[str, ...]]    # (CPU milli, milli per GPU, GPUs, models)


def shape_of(res: WorkerResources) -> Shape | None:
    if res.is_mig:
        return None                       # FGD models GPU shares, not MIG slices
    if res.is_share:
        return (res.cpu_milli, res.gpu_milli, 1, res.gpu_models)
    return (res.cpu_milli, 1000 if res.gpus else 0, res.gpus, res.gpu_models)


def typical_shapes(state: StateLike, pool: str, popularity: float = POPULARITY) -> dict[Shape, float]:
    """The pool's current workload (pending jobs and jobs holding GPUs), one count per
    worker, reduced to the most frequent shapes covering ``popularity`` of them, with
    their frequencies (summing to 1). Empty when the state has no jobs to look at."""
    jobs: Mapping[str, JobState] = getattr(state, "jobs", {})
    ids = list(getattr(state, "pending", ()))
    ids += [j for node in state.nodes.values() if node.info.pool == pool for j in node.jobs]
    counts: dict[Shape, int] = {}
    for job_id in dict.fromkeys(ids):
        job = jobs.get(job_id)
        if job is None or (spec := job.spec).pool != pool:
            continue
        res = spec.resources    # shape_of, inlined: this loop sees every pending job
        if res.mig_profile:
            continue
        if res.gpu_milli > 0 and res.gpus == 0:
            shape = (res.cpu_milli, res.gpu_milli, 1, res.gpu_models)
        else:
            shape = (res.cpu_milli, 1000 if res.gpus else 0, res.gpus, res.gpu_models)
        counts[shape] = counts.get(shape, 0) + spec.workers
    total = sum(counts.values())
    chosen, covered = {}, 0
    # Most frequent first; equal counts in a fixed order, so the mix is deterministic.
    for shape, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        if covered >= popularity * total:
            break
        chosen[shape] = n
        covered += n
    return {shape: n / covered for shape, n in chosen.items()}


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
    and a request's per-node best (``Best``, refreshed from the ``touched`` log)."""

    def __init__(self, arrays: NodeArrays, mix: dict[Shape, float], patience: float = PATIENCE,
                 lookahead: bool = False) -> None:
        self.arrays = arrays
        self.lookahead = lookahead   # whose keys ``scorer`` packs: fgd-lookahead's, or FGD's
        self.shapes = mix
        self.patience = patience
        self.mix = compile_mix(mix, arrays.models)
        self.u = usable(self.mix, arrays.gpu, arrays.cpu, arrays.model)
        self._waste: np.ndarray | None = None
        self.stale: set[int] = set()          # rows changed since the last ``sync``
        # Every row changed, in order (what each Best has seen), and the rows that gained
        # capacity (CPU, memory or a GPU's free milli): only those can start to fit.
        self.touched: list[int] = []
        self.grown: list[int] = []
        self.initial = list(arrays.plain)     # (GPUs, CPU, memory, idle) before any change
        self.best: dict[WorkerResources, Best] = {}   # oldest first
        self._scorer: RowScorer | None = None
        self.plain: dict[int, Row] = {}   # changed rows as plain Python values
        self.moved = np.zeros(len(arrays.nodes), dtype=bool)   # changed since the view was built
        self.models: list[int] = arrays.model.tolist()
        # Rows alike in what a score reads (free milli per GPU, CPU, model, idleness) at
        # the start: ``Fgd.fill`` scores one row of each group.
        alike = np.column_stack((arrays.gpu, arrays.cpu, arrays.model, arrays.idle))
        self.group = np.unique(alike, axis=0, return_inverse=True)[1].reshape(-1) if len(alike) else alike

    def final_waste(self) -> np.ndarray:
        if self._waste is None:
            self._waste = final_waste(self.shapes, self.patience)
        return self._waste

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
        scorer, u, moved, model, plain = self.scorer, self.u, self.moved, self.models, self.plain
        for i in rows:
            gpu, cpu, mem, idle = a.plain[i]
            if len(rows) <= FEW_ROWS:
                u[i] = scorer.usable_row(gpu, cpu, model[i])
            moved[i] = True
            was = plain.get(i) or self.initial[i]
            if cpu > was[1] or mem > was[2] or any(map(gt, gpu, was[0])):
                self.grown.append(i)
            self.touched.append(i)
            plain[i] = scorer.row(gpu, cpu, mem, model[i], idle, float(u[i]))

    @property
    def scorer(self) -> RowScorer:
        if self._scorer is None:
            self._scorer = RowScorer(self.mix, self.final_waste, self.lookahead)
        return self._scorer


@dataclass(slots=True)
class Best:
    """One request's best candidate on each node: its packed sort key (``NONE`` where
    the node cannot take it) and GPU index. Capacity that only shrank cannot make a
    node fit, so of the rows changed since, only those that fitted, or grew, are
    scored again."""

    seen: int              # entries of ``touched`` seen
    grown: int             # entries of ``grown`` seen
    key: np.ndarray
    gpu: np.ndarray
    fits: set[int]         # rows whose key is not NONE


NONE = np.iinfo(np.int64).max
FEW_ROWS = 256            # changed rows rescored one by one in Python (frag_rows); more: numpy
CACHED_REQUESTS = 256    # distinct requests a view keeps the per-node best of


class Fgd:
    """Fragmentation gradient descent: least growth of fragmentation, then first fit."""

    name = "fgd"
    lookahead = False   # whether ``packed`` adds fgd-lookahead's keys (``frag_rows`` mirrors it)

    def __init__(self, popularity: float = POPULARITY) -> None:
        if not 0 < popularity <= 1:
            raise ValueError(f"popularity must be in (0, 1], not {popularity!r}")
        self.popularity = popularity
        self.patience = PATIENCE   # what the view's final waste uses; FGD itself never asks

    def choose(self, state: StateLike, statement: Statement, job: JobState, res: WorkerResources) -> Choice | None:
        pool = job.spec.pool
        if res.is_mig:
            return choose_mig(state.nodes, pool, res)
        view = self.view(state, statement, pool)
        found = self.first(view, res)
        if found is None:
            return None
        node = view.arrays.nodes[found[0]]
        slots = take(node, pool, res, found[1])
        if slots is not None:
            return node, slots
        # The arrays do not see everything (a share's GPU memory): the node refused the
        # first candidate, so walk the whole order as ``scan`` does.
        return self.scan(view, pool, res)

    def scan(self, view: FragView, pool: str, res: WorkerResources) -> Choice | None:
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

    def first(self, view: FragView, res: WorkerResources) -> tuple[int, int] | None:
        """(row, GPU index) of the first candidate in ``ranked``'s order over every
        feasible row, or None: from each node's best candidate, kept per request and
        recomputed only for the nodes changed since it was last asked."""
        view.sync()
        arrays = view.arrays
        best = view.best.get(res)
        if best is None:
            if len(view.best) >= CACHED_REQUESTS:
                del view.best[next(iter(view.best))]   # the oldest
            count = len(arrays.nodes)
            best = view.best[res] = Best(len(view.touched), len(view.grown), np.full(count, NONE, dtype=np.int64),
                                         np.zeros(count, np.int64), set())
            self.fill(view, best, res)
            best.fits.update(np.flatnonzero(best.key != NONE).tolist())
        elif best.seen < len(view.touched):
            rows = best.fits.intersection(view.touched[best.seen:])
            if best.grown < len(view.grown):
                rows.update(view.grown[best.grown:])
            best.seen, best.grown = len(view.touched), len(view.grown)
            if len(rows) <= FEW_ROWS:
                self.rescore(view, best, rows, res)
            else:
                at = np.array(sorted(rows), dtype=np.int64)
                best.key[at] = NONE
                self.refresh(view, best, arrays.feasible(res, at), res)
                best.fits.difference_update(rows)
                best.fits.update(at[best.key[at] != NONE].tolist())
        i = int(best.key.argmin())   # the first row of the least key: registration order
        return None if best.key[i] == NONE else (i, int(best.gpu[i]))

    def fill(self, view: FragView, best: Best, res: WorkerResources) -> None:
        """``best`` of a request asked for the first time in the cycle: rows that have
        not changed since the view was built score alike within a group of equal rows,
        so one row of each group is scored; the changed ones are scored one by one."""
        rows = view.arrays.feasible(res)
        moved = view.moved[rows]
        fresh = rows[~moved]
        if fresh.size:
            _, first, inverse = np.unique(view.group[fresh], return_index=True, return_inverse=True)
            scored = fresh[first]
            self.refresh(view, best, scored, res)
            best.key[fresh] = best.key[scored][inverse]
            best.gpu[fresh] = best.gpu[scored][inverse]
        changed = rows[moved]
        if changed.size > FEW_ROWS:
            self.refresh(view, best, changed, res)
        elif changed.size:
            self.rescore(view, best, changed.tolist(), res)

    def rescore(self, view: FragView, best: Best, rows: Iterable[int], res: WorkerResources) -> None:
        """``refresh`` of a few changed rows, one by one (``frag_rows``: the same numbers)."""
        scorer, plain, key, index = view.scorer, view.plain, best.key, best.gpu
        need_cpu, need_mem, gpus = res.cpu_milli, res.memory_mib, res.gpus
        share = res.gpu_milli if res.is_share else 0
        allowed = [res.allows(m) for m in view.arrays.models]
        fits = best.fits
        for i in rows:
            row = plain[i]
            _, cpu, mem, model, _, _, largest, whole, _ = row
            if cpu < need_cpu or mem < need_mem or not allowed[model] or largest < share or whole < gpus:
                key[i] = NONE
                fits.discard(i)
                continue
            fits.add(i)
            key[i], index[i] = scorer.best(row, res)

    def refresh(self, view: FragView, best: Best, rows: np.ndarray, res: WorkerResources) -> None:
        """``best`` on the feasible ``rows`` (sorted): per row, its least candidate by
        (keys, GPU index), as ``ranked`` orders a row's candidates."""
        if not rows.size:
            return
        arrays = view.arrays
        rows, gpu_index, after = candidates(arrays, rows, res)
        growth = view.u[rows] - usable(view.mix, after, arrays.cpu[rows] - res.cpu_milli,
                                       arrays.model[rows]) - res.milli
        radix = arrays.gpu.shape[1] + 1
        packed = self.packed(view, rows, after, growth) * radix + (gpu_index + 1)
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

    def ranked(self, view: FragView, rows: np.ndarray, res: WorkerResources):
        """(candidate rows, their GPU index, the candidates' indices best first) of ``res``
        on the feasible ``rows`` (``view`` synced)."""
        arrays = view.arrays
        rows, gpu_index, after = candidates(arrays, rows, res)
        # Fragmentation is free milli - U: placing takes res.milli and changes U.
        growth = view.u[rows] - usable(view.mix, after, arrays.cpu[rows] - res.cpu_milli,
                                       arrays.model[rows]) - res.milli
        keys = self.keys(view, rows, after, growth)
        return rows, gpu_index, np.lexsort((gpu_index, rows, *reversed(keys)))

    def view(self, state: StateLike, statement: Statement, pool: str) -> FragView:
        key = (self.name, self.popularity, self.patience, pool)
        view = statement.views.get(key)
        if view is None:
            arrays = arrays_for(statement, state.nodes, pool)
            view = statement.views[key] = FragView(arrays, typical_shapes(state, pool, self.popularity),
                                                   self.patience, self.lookahead)
        return view

    def keys(self, view: FragView, rows: np.ndarray, after: np.ndarray, growth: np.ndarray) -> list[np.ndarray]:
        """Sort keys of the candidates, most significant first, lower better (then node
        registration order, then GPU index)."""
        return [fgd_score(growth)]

    def packed(self, view: FragView, rows: np.ndarray, after: np.ndarray, growth: np.ndarray) -> np.ndarray:
        """``keys`` as one integer each, in the same order (they are small integers)."""
        return fgd_score(growth).astype(np.int64) + 100


def fgd_score(growth: np.ndarray) -> np.ndarray:
    """The reference's integer score of a fragmentation change, negated (lower better)."""
    return -np.floor(100 / (1 + np.exp(growth / 1000)))


def candidates(arrays: NodeArrays, rows: np.ndarray, res: WorkerResources):
    """(rows, GPU index, free milli per GPU after placing) of every distinct way to place
    ``res`` on the feasible ``rows``: one per node, or for a share one per node and free
    amount (GPUs with the same free milli are interchangeable; the lowest index stands for
    them). ``gpu_index`` is -1 when the worker takes no single chosen GPU."""
    gpu = arrays.gpu[rows]
    if res.is_share:
        r, g = np.nonzero(gpu >= res.gpu_milli)
        _, first = np.unique(r * 1001 + gpu[r, g], return_index=True)
        r, g = r[first], g[first]
        after = gpu[r].copy()
        after[np.arange(len(r)), g] -= res.gpu_milli
        return rows[r], g, after
    if res.gpus:   # the lowest-index free GPUs, as pick_gpus takes them
        free = gpu == 1000
        after = gpu - 1000 * (free & (np.cumsum(free, axis=1) <= res.gpus))
        return rows, np.full(len(rows), -1), after
    return rows, np.full(len(rows), -1), gpu


def take(node: NodeState, pool: str, res: WorkerResources, index: int) -> tuple[GpuSlot, ...] | None:
    """The slots of a scored candidate, checked on the node itself."""
    if node.info.pool != pool or not fits_node(node, res):
        return None
    if index < 0:
        return pick_gpus(node, res)
    if not res.allows(node.model) or not node.gpus[index].fits_share(res.gpu_milli, res.gpu_memory_mib):
        return None
    return (GpuSlot(index, res.gpu_milli),)


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
    w = np.zeros(1001)
    for f in range(1, 1001):
        k = int(np.searchsorted(sizes, f, side="right"))     # shares that fit: sizes[:k]
        reach = p[:k].sum() + (whole if f == 1000 else 0.0)
        w[f] = (patience * f + p[:k] @ w[f - sizes[:k]]) / (patience + reach)
    return w
