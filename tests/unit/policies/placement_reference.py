"""A TEST ORACLE, not production code: a frozen copy of FGD and fgd-lookahead as they
were before the policies were made fast (``gpusched/policies/placement/fgd/``
scoring every feasible node with numpy at every decision, and the ``NodeArrays`` mirror
they read). ``placement/fgd/test_pool_scores.py`` runs it beside the production policies and
requires the same decision, node and GPUs, everywhere. Do not "fix" or speed it up: its
whole value is that it stays as it was. Its names (``reference-fgd``...) and statement
views are its own, so it never shares a cached view with the production policies.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import numpy as np

from gpusched.core.model import GpuSlot, WorkerResources
from gpusched.core.state import JobState, NodeState
from gpusched.policies.statement import Statement
from gpusched.policies.gpu_fit import StateLike, fits_node, pick_gpus
from gpusched.policies.placement.gang import Choice
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
    counts: Counter[Shape] = Counter()
    for job_id in dict.fromkeys(ids):
        job = jobs.get(job_id)
        if job is not None and job.spec.pool == pool and (shape := shape_of(job.spec.resources)):
            counts[shape] += job.spec.workers
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
    """``U`` of every node of a pool under the cycle's task mix, kept up to date."""

    def __init__(self, arrays: NodeArrays, mix: dict[Shape, float], patience: float = PATIENCE) -> None:
        self.arrays = arrays
        self.shapes = mix
        self.patience = patience
        self.mix = compile_mix(mix, arrays.models)
        self.u = usable(self.mix, arrays.gpu, arrays.cpu, arrays.model)
        self._waste: np.ndarray | None = None

    def final_waste(self) -> np.ndarray:
        if self._waste is None:
            self._waste = final_waste(self.shapes, self.patience)
        return self._waste

    def touch(self, names: Iterable[str]) -> None:
        rows = [i for n in names if (i := self.arrays.row.get(n)) is not None]
        if rows:
            a = self.arrays
            self.u[rows] = usable(self.mix, a.gpu[rows], a.cpu[rows], a.model[rows])


class Fgd:
    """Fragmentation gradient descent: least growth of fragmentation, then first fit."""

    name = "reference-fgd"

    def __init__(self, popularity: float = POPULARITY) -> None:
        if not 0 < popularity <= 1:
            raise ValueError(f"popularity must be in (0, 1], not {popularity!r}")
        self.popularity = popularity
        self.patience = PATIENCE   # what the view's final waste uses; FGD itself never asks

    def choose(self, state: StateLike, statement: Statement, job: JobState, res: WorkerResources) -> Choice | None:
        pool = job.spec.pool
        if res.is_mig:
            return choose_mig(statement, state.nodes, pool, res)
        view = self.view(state, statement, pool)
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

    def rank(self, state: StateLike, statement: Statement, job: JobState, res: WorkerResources,
             nodes: Sequence[NodeState]) -> dict[str, int]:
        """A gang's nodes, each by its best candidate's place in ``choose``'s order."""
        if res.is_mig:
            return rank_mig(nodes, job.spec.pool, res)
        view = self.view(state, statement, job.spec.pool)
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
        on the feasible ``rows``."""
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
            arrays = reference_arrays(statement, state.nodes, pool)
            view = statement.views[key] = FragView(arrays, typical_shapes(state, pool, self.popularity),
                                                   self.patience)
        return view

    def keys(self, view: FragView, rows: np.ndarray, after: np.ndarray, growth: np.ndarray) -> list[np.ndarray]:
        """Sort keys of the candidates, most significant first, lower better (then node
        registration order, then GPU index)."""
        return [fgd_score(growth)]


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

    name = "reference-fgd-lookahead"

    def __init__(self, popularity: float = POPULARITY, patience: float = PATIENCE) -> None:
        super().__init__(popularity)
        if patience <= 0:
            raise ValueError(f"patience must be > 0, not {patience!r}")
        self.patience = patience

    def keys(self, view, rows, after, growth):
        waste = view.final_waste()
        growth_of_waste = (waste[after] - waste[view.arrays.gpu[rows]]).sum(axis=1)
        return [fgd_score(growth), np.round(growth_of_waste), view.arrays.idle[rows]]


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


def reference_arrays(statement: Statement, nodes: Mapping[str, NodeState], pool: str) -> "NodeArrays":
    key = ("reference-arrays", pool)
    view = statement.views.get(key)
    if view is None:
        view = statement.views[key] = NodeArrays(nodes, pool)
    return view


class NodeArrays:
    def __init__(self, nodes: Mapping[str, NodeState], pool: str) -> None:
        self.nodes = [n for n in nodes.values() if n.info.pool == pool]
        self.row = {n.name: i for i, n in enumerate(self.nodes)}
        self.models = sorted({n.model for n in self.nodes})
        width = max((len(n.gpus) for n in self.nodes), default=0)
        count = len(self.nodes)
        self.cpu = np.zeros(count, dtype=np.int64)       # free CPU milli (-1: not ready)
        self.mem = np.zeros(count, dtype=np.int64)       # free memory MiB
        self.gpu = np.zeros((count, width), dtype=np.int64)   # free milli of each GPU
        self.ngpu = np.array([len(n.gpus) for n in self.nodes], dtype=np.int64)
        self.idle = np.zeros(count, dtype=bool)          # nothing runs or is booked on it
        self.model = np.array([self.models.index(n.model) for n in self.nodes], dtype=np.int64)
        self._allowed: dict[tuple[str, ...], np.ndarray] = {}
        for i in range(count):
            self._refresh(i)

    def touch(self, names: Iterable[str]) -> None:
        for name in names:
            i = self.row.get(name)
            if i is not None:
                self._refresh(i)

    def _refresh(self, i: int) -> None:
        node = self.nodes[i]
        self.cpu[i] = node.free_cpu if node.schedulable else -1
        self.mem[i] = node.free_mem
        self.idle[i] = not node.jobs
        for j, g in enumerate(node.gpus):
            self.gpu[i, j] = 1000 - g.used_milli if g.healthy and not g.mig_mask and g.whole_ok else 0

    def allowed(self, res: WorkerResources) -> np.ndarray:
        """Rows whose GPU model ``res`` accepts (every row for a model-free request)."""
        key = res.gpu_models
        mask = self._allowed.get(key)
        if mask is None:
            ok = np.array([res.allows(m) for m in self.models], dtype=bool)
            mask = self._allowed[key] = ok[self.model] if len(self.models) else np.zeros(0, bool)
        return mask

    def feasible(self, res: WorkerResources) -> np.ndarray:
        """Rows with room for one worker of ``res`` (not MIG), in registration order."""
        ok = (self.cpu >= res.cpu_milli) & (self.mem >= res.memory_mib) & self.allowed(res)
        if res.is_share:
            ok &= (self.gpu >= res.gpu_milli).any(axis=1)
        elif res.gpus:
            ok &= (self.gpu == 1000).sum(axis=1) >= res.gpus
        return np.flatnonzero(ok)
