"""FGD's rule (Weng et al., "Beware of Fragmentation", ATC'23), and ``fgd-lookahead``'s
look-ahead, over numpy arrays of a pool's nodes: what the rest of ``placement.fgd`` keeps
up to date and computes faster, never defines again.

* **Typical tasks** (``typical_of``): the shapes (CPU milli, milli per GPU, GPUs, allowed
  models: ``Shape``) of the pool's workload, one count per worker, reduced to the most
  frequent shapes covering ``popularity`` of them, with their frequencies ``p_t``
  (summing to 1). Which jobs are counted: ``task_mix``.
* **Fragmentation** of a node: the free GPU capacity the typical tasks could not use
  there, averaged by ``p_t``: for a shape that fits the node (model, CPU, and enough GPUs
  with room), the free milli of the GPUs too small for it; for one that does not fit, all
  of the node's free GPU milli. Equivalently ``free milli - U``, where the node's *usable*
  capacity is ``U = sum_t p_t [t fits] (free milli of the GPUs big enough for t)``
  (``usable``).
* **Gradient** of placing a worker on a candidate (``growth``): fragmentation after minus
  before, ``U(before) - U(after) - request milli``. A candidate is one way to place the
  worker on a node (``candidates``: for a share, also which GPU).
* **Score** (``fgd_score``): as in the reference simulator, the growth as the integer
  ``floor(100 * sigmoid(-growth / 1000))``, negated, lower better; close calls tie and go
  to the node registered first, then the lowest GPU index: fragmentation first, then
  first-fit packing.
* **fgd-lookahead** breaks FGD's ties by the growth of the GPUs' *expected final waste*
  (``final_waste``), then a node in use before an idle one (``policy.FgdLookahead``).
"""
from __future__ import annotations

from bisect import bisect_right
from collections import Counter
from dataclasses import dataclass
from typing import Any, Mapping, NamedTuple

import numpy as np

from gpusched.core.model import WorkerResources
from gpusched.policies.placement.arrays import NodeArrays

POPULARITY = 0.95    # the most frequent shapes covering this share of tasks are "typical"
PATIENCE = 0.1       # fgd-lookahead: how soon a GPU stops getting tasks (final_waste)


class Shape(NamedTuple):
    """A task's shape as FGD counts it: a share is one GPU of ``milli``, whole GPUs 1000."""

    cpu: int                  # CPU milli
    milli: int                # milli per GPU (0: a CPU-only task)
    gpus: int                 # GPUs it needs
    models: tuple[str, ...]   # the GPU models it accepts (empty: any)


# A request's fields as the mix counts them (``task_mix``): (CPU milli, GPU milli, GPUs,
# models, MIG profile).
Fields = tuple


def shape_of(res: WorkerResources) -> Shape | None:
    if res.is_mig:
        return None                       # FGD models GPU shares, not MIG slices
    if res.is_share:
        return Shape(res.cpu_milli, res.gpu_milli, 1, res.gpu_models)
    return Shape(res.cpu_milli, 1000 if res.gpus else 0, res.gpus, res.gpu_models)


def typical_of(raw: Mapping[Fields, int], popularity: float = POPULARITY) -> dict[Shape, float]:
    """The most frequent shapes of ``raw`` (workers by request fields) covering
    ``popularity`` of the workers, with their frequencies (summing to 1); MIG requests
    left out."""
    counts: dict[Shape, int] = {}
    for (cpu, milli, gpus, models, mig), n in raw.items():
        if mig:
            continue
        if milli > 0 and gpus == 0:
            shape = Shape(cpu, milli, 1, models)
        else:
            shape = Shape(cpu, 1000 if gpus else 0, gpus, models)
        counts[shape] = counts.get(shape, 0) + n
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
class MixArrays:
    """The typical shapes as arrays over one pool's models and CPU thresholds."""

    milli: np.ndarray      # (K,) milli per GPU of each (milli, GPUs) combination
    count: np.ndarray      # (K,) GPUs it needs
    cpu_levels: np.ndarray # sorted distinct CPU requests
    weight: np.ndarray     # (K, models, levels+1): sum of p_t over shapes t of the combination
                           # the model accepts with CPU request <= the level's


def compile_mix(mix: dict[Shape, float], models: list[str]) -> MixArrays:
    # Shapes unpacked, not read by name: a mix's keys may be plain tuples of ``Shape``'s fields.
    gpu_shapes = [((cpu, milli, gpus, models), p) for (cpu, milli, gpus, models), p in mix.items() if gpus]
    combos = sorted({(milli, gpus) for (_, milli, gpus, _), _ in gpu_shapes})
    levels = np.array(sorted({cpu for (cpu, _, _, _), _ in gpu_shapes}), dtype=np.int64)
    weight = np.zeros((len(combos), len(models), len(levels) + 1))
    where = {c: i for i, c in enumerate(combos)}
    for (cpu, milli, gpus, allowed), p in gpu_shapes:
        level = int(np.searchsorted(levels, cpu, side="right"))
        for m, model in enumerate(models):
            if not allowed or model in allowed:
                weight[where[(milli, gpus)], m, level:] += p
    return MixArrays(np.array([milli for milli, _ in combos], dtype=np.int64),
                     np.array([gpus for _, gpus in combos], dtype=np.int64), levels, weight)


def usable(mix: MixArrays, gpu: np.ndarray, cpu: np.ndarray, model: np.ndarray) -> np.ndarray:
    """U per row: free milli typical GPU tasks could use, weighted by their frequency."""
    if not mix.milli.size:
        return np.zeros(len(cpu))
    big = gpu[:, None, :] >= mix.milli[None, :, None]                  # rows, combos, GPUs
    room = (gpu[:, None, :] * big).sum(axis=2)
    fits = big.sum(axis=2) >= mix.count[None, :]
    level = np.searchsorted(mix.cpu_levels, cpu, side="right")
    weight = mix.weight[:, model, level].T                             # rows, combos
    return (weight * fits * room).sum(axis=1)


def growth(mix: MixArrays, u: np.ndarray, arrays: NodeArrays, rows: np.ndarray, after: np.ndarray,
           res: WorkerResources) -> np.ndarray:
    """The gradient of each candidate (``candidates``): its rows' fragmentation after
    placing ``res`` minus before, given the rows' ``u`` before. Fragmentation is free
    milli - U, and placing takes ``res.milli`` and changes U."""
    return u - usable(mix, after, arrays.cpu[rows] - res.cpu_milli, arrays.model[rows]) - res.milli


def fgd_score(growth: np.ndarray | float) -> Any:
    """The reference's integer score of a fragmentation change, negated (lower better)."""
    return -np.floor(100 / (1 + np.exp(growth / 1000)))


def candidates(arrays: NodeArrays, rows: np.ndarray, res: WorkerResources, memory: bool = False):
    """(rows, GPU index, free milli per GPU after placing) of every distinct way to place
    ``res`` on the feasible ``rows``: one per node, or for a share one per node and free
    amount (GPUs with the same free milli are interchangeable; the lowest index stands for
    them). ``gpu_index`` is -1 when the worker takes no single chosen GPU. With
    ``memory``, a share's candidates whose GPU lacks the GPU memory it asks for are left
    out: the node would refuse them (``policy.take``), and the next candidate in order is
    the decision."""
    gpu = arrays.gpu[rows]
    if res.is_share:
        r, g = np.nonzero(gpu >= res.gpu_milli)
        _, first = np.unique(r * 1001 + gpu[r, g], return_index=True)
        r, g = r[first], g[first]
        if memory and res.gpu_memory_mib:
            room = arrays.gmem[rows[r], g] >= res.gpu_memory_mib
            r, g = r[room], g[room]
        after = gpu[r].copy()
        after[np.arange(len(r)), g] -= res.gpu_milli
        return rows[r], g, after
    if res.gpus:   # the lowest-index free GPUs, as pick_gpus takes them
        free = gpu == 1000
        after = gpu - 1000 * (free & (np.cumsum(free, axis=1) <= res.gpus))
        return rows, np.full(len(rows), -1), after
    return rows, np.full(len(rows), -1), gpu


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
