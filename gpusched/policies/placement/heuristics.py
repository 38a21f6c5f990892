"""Placement policies: indexed best-fit (the default) and the FGD paper's baselines.

* ``best-fit``: the node left with the least free capacity, CPU and GPU together, as in
  the FGD paper's BestFit: ``free CPU / 128 cores + free GPU milli / 8 GPUs``, i.e. one GPU
  weighs as much as 16 cores. Found through ``FreeIndex`` without scanning the pool.
* ``random``, ``dot-product`` (Tetris-style alignment of free and requested CPU/GPU),
  ``gpu-packing`` (shared GPUs first, then used nodes, then idle ones) and
  ``gpu-clustering`` (nodes already running the same GPU shape): the baselines of
  "Beware of Fragmentation" (Weng et al., ATC'23), scoring every node with numpy. Their
  scores are the reference simulator's integers 0..100, so equal scores go to the node
  registered first, as there.

Inside a node, GPUs are picked best-fit (``pick_gpus``); MIG slices by ``choose_mig``,
through ``MigIndex`` (nodes by where the profile fits) for every policy.
"""
from __future__ import annotations

from collections import Counter
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np

from gpusched.core.mig import parse_profile
from gpusched.core.model import WorkerResources
from gpusched.core.state import JobState, NodeState
from gpusched.policies.statement import Statement, lent_state
from gpusched.policies.gpu_fit import StateLike, fit
from gpusched.policies.placement.gang import Choice
from gpusched.policies.placement.arrays import NodeArrays, arrays_for
from gpusched.policies.placement.index import FreeIndex, first_fit
from gpusched.policies.placement.kept_index import view
from gpusched.policies.placement.mig_index import MigIndex

# The reference simulator's normalisers: the largest node has 128 cores and 8 GPUs.
MAX_CPU_MILLI = 128_000
MAX_GPU_MILLI = 8_000
GPU_WEIGHT = MAX_CPU_MILLI // MAX_GPU_MILLI     # CPU milli one GPU milli weighs in best-fit


def free_gpu_milli(node: NodeState) -> int:
    return sum(1000 - g.used_milli for g in node.gpus if g.healthy and not g.mig_mask and g.whole_ok)


def best_fit_key(node: NodeState) -> int:
    return node.free_cpu + GPU_WEIGHT * free_gpu_milli(node)


def choose_mig(statement: Statement, nodes: Mapping[str, NodeState], pool: str,
               res: WorkerResources) -> Choice | None:
    """A MIG slice on the tightest node (``best_fit_key``), preferring nodes whose slice goes
    on a GPU already cut (keeps whole GPUs whole); ties by registration order. Found through
    the statement's ``MigIndex`` for the profile, which holds only nodes with room for it."""
    profile = parse_profile(res.mig_profile)
    if profile is None:
        return None   # a profile no GPU offers
    index = view(statement, ("mig", pool, profile.name), lambda: MigIndex(nodes, pool, profile, GPU_WEIGHT))
    # The key is at least the node's free CPU: nodes below the request's CPU cannot take it.
    return first_fit(index, res, res.cpu_milli, fit)


def free_index(statement: Statement, state: StateLike, pool: str) -> FreeIndex:
    """The statement's ``FreeIndex`` of ``pool``: kept between cycles where the cycle keeps
    indexes (``kept_index``), else built at its first use in the call."""
    return view(statement, ("free", pool), lambda: FreeIndex(state.nodes, pool, GPU_WEIGHT))  # type: ignore[return-value]


def ranks_by(nodes: Sequence[NodeState], key: Callable[[NodeState], object]) -> dict[str, int]:
    """Rank of each of ``nodes`` (given in registration order) by ``key``, then that order."""
    ranked = sorted(range(len(nodes)), key=lambda i: (key(nodes[i]), i))
    return {nodes[i].name: r for r, i in enumerate(ranked)}


def rank_mig(nodes: Sequence[NodeState], pool: str, res: WorkerResources) -> dict[str, int]:
    """``choose_mig``'s preference as a rank: nodes with a GPU already cut first, then tightest."""
    def key(node: NodeState) -> tuple:
        slots = fit(node, pool, res)
        return (slots is None or node.gpus[slots[0].index].mig_mask == 0, best_fit_key(node))
    return ranks_by(nodes, key)


class BestFit:
    name = "best-fit"

    def choose(self, state: StateLike, statement: Statement, job: JobState, res: WorkerResources) -> Choice | None:
        pool = job.spec.pool
        if res.is_mig:
            return choose_mig(statement, state.nodes, pool, res)
        index = free_index(statement, state, pool)
        return first_fit(index, res, res.cpu_milli + GPU_WEIGHT * res.milli, fit)

    def rank(self, state: StateLike, statement: Statement, job: JobState, res: WorkerResources,
             nodes: Sequence[NodeState]) -> dict[str, int]:
        """A gang's nodes: the tightest first, as ``choose`` takes them."""
        if res.is_mig:
            return rank_mig(nodes, job.spec.pool, res)
        return ranks_by(nodes, best_fit_key)

    def rank_key(self, state: StateLike, statement: Statement, job: JobState,
                 res: WorkerResources) -> Callable[[NodeState], object] | None:
        """``rank``'s order as a key, read off the free index: its entry of a schedulable
        node is (``best_fit_key``, registration order, name). None for MIG (``rank_mig``)."""
        if res.is_mig:
            return None
        pool = job.spec.pool
        index = free_index(statement, state, pool)
        where = index.where
        return lambda node: where[node.name][0]


class ScoredPlacement:
    """Scores every feasible node at once (lower is better); ties by registration order."""

    name = ""

    def choose(self, state: StateLike, statement: Statement, job: JobState, res: WorkerResources) -> Choice | None:
        pool = job.spec.pool
        if res.is_mig:
            return choose_mig(statement, state.nodes, pool, res)
        arrays = arrays_for(statement, state.nodes, pool)
        rows = arrays.feasible(res)
        if not rows.size:
            return None
        scores = self.score(state, statement, arrays, rows, job, res)
        for i in np.argsort(scores, kind="stable"):
            node = arrays.nodes[rows[i]]
            slots = fit(node, pool, res)
            if slots is not None:
                return node, slots
        return None

    def rank(self, state: StateLike, statement: Statement, job: JobState, res: WorkerResources,
             nodes: Sequence[NodeState]) -> dict[str, int]:
        """A gang's nodes, ordered by the same score as ``choose``."""
        if res.is_mig:
            return rank_mig(nodes, job.spec.pool, res)
        arrays = arrays_for(statement, state.nodes, job.spec.pool)
        rows = np.array([arrays.row[n.name] for n in nodes], dtype=np.int64)
        scores = self.score(state, statement, arrays, rows, job, res)
        return {nodes[i].name: r for r, i in enumerate(np.argsort(scores, kind="stable"))}

    def score(self, state: StateLike, statement: Statement, arrays: NodeArrays, rows: np.ndarray,
              job: JobState, res: WorkerResources) -> np.ndarray:
        raise NotImplementedError


class RandomPlacement(ScoredPlacement):
    """A pseudo-random node per job: a hash of the job's submission number and the node's
    row (splitmix64), so the choice is random-looking yet a pure function of the state."""

    name = "random"

    def score(self, state, statement, arrays, rows, job, res):
        x = rows.astype(np.uint64) + np.uint64(job.seq * 0x9E3779B97F4A7C15 % 2 ** 64)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


class DotProduct(ScoredPlacement):
    """Tetris' alignment score as the reference simulator computes it (free and requested
    CPU and GPU, each over the largest node's): the smallest dot product wins."""

    name = "dot-product"

    def score(self, state, statement, arrays, rows, job, res):
        free_cpu = arrays.cpu[rows] / MAX_CPU_MILLI
        free_gpu = arrays.gpu[rows].sum(axis=1) / MAX_GPU_MILLI
        dot = free_cpu * (res.cpu_milli / MAX_CPU_MILLI) + free_gpu * (res.milli / MAX_GPU_MILLI)
        return -np.floor(100 * (1 - dot / 2))


class GpuPacking(ScoredPlacement):
    """Shares of used GPUs first (fewer idle milli on them better), then free GPUs of used
    nodes (fewer better), then idle nodes (smaller better); CPU-only jobs: first fit."""

    name = "gpu-packing"

    def score(self, state, statement, arrays, rows, job, res):
        if not (res.gpus or res.is_share):
            return np.zeros(rows.size)
        gpu = arrays.gpu[rows]
        whole = (gpu == 1000).sum(axis=1)
        idle_node = whole == arrays.ngpu[rows]
        if res.is_share:   # the tightest GPU that fits: a used one, or a free one
            fits = np.where(gpu >= res.gpu_milli, gpu, 10_000).min(axis=1)
            on_used = np.maximum(100 - (fits * 100 // 1000) // 10, 50)
            score = np.where(fits < 1000, on_used, 49)
        else:
            score = np.full(rows.size, max(50 - res.gpus, 33))
        score = np.where(idle_node, np.maximum(33 - whole, whole), score)
        return -score


class GpuClustering(ScoredPlacement):
    """Nodes running only jobs of the same GPU shape first, then mixed nodes with it,
    then idle nodes, then the rest; fuller nodes first inside each class."""

    name = "gpu-clustering"

    def score(self, state, statement, arrays, rows, job, res):
        tag = shape_tag(res)
        if not tag:
            return np.zeros(rows.size)
        tags = statement.views.get(("tags", job.spec.pool))
        if tags is None:   # the jobs of the state lent to the statement, where it has one
            lent = lent_state(statement)
            jobs = getattr(state if lent is None else lent, "jobs", {})
            tags = statement.views[("tags", job.spec.pool)] = NodeTags(arrays, jobs)
        fuller = 25 * (MAX_GPU_MILLI - arrays.gpu[rows].sum(axis=1)) // MAX_GPU_MILLI
        has, count = tags.has(tag)[rows], tags.count[rows]
        klass = np.where(has, np.where(count == 1, 75, 50), np.where(count == 0, 25, 0))
        return -(fuller + klass)


def shape_tag(res: WorkerResources) -> str:
    if res.is_mig:
        return f"mig-{res.mig_profile}"
    if res.is_share:
        return "share"
    return f"{res.gpus}-gpu" if res.gpus else ""


class NodeTags:
    """The GPU shapes of the jobs on each node (what GpuClustering clusters by)."""

    def __init__(self, arrays: NodeArrays, jobs: Mapping[str, JobState]) -> None:
        self.arrays, self.jobs = arrays, jobs
        self.tags: list[Counter[str]] = [Counter() for _ in arrays.nodes]
        self.count = np.zeros(len(arrays.nodes), dtype=np.int64)
        self._has: dict[str, np.ndarray] = {}
        for i in range(len(arrays.nodes)):
            self._refresh(i)

    def touch(self, names: Iterable[str]) -> None:
        for name in names:
            i = self.arrays.row.get(name)
            if i is not None:
                self._refresh(i)

    def _refresh(self, i: int) -> None:
        node = self.arrays.nodes[i]
        counter = Counter(t for j in node.jobs if j in self.jobs and (t := shape_tag(self.jobs[j].spec.resources)))
        old = self.tags[i]
        self.tags[i] = counter
        self.count[i] = len(counter)
        for tag in set(old) | set(counter):
            if tag in self._has:
                self._has[tag][i] = tag in counter

    def has(self, tag: str) -> np.ndarray:
        mask = self._has.get(tag)
        if mask is None:
            mask = self._has[tag] = np.array([tag in c for c in self.tags], dtype=bool)
        return mask
