"""The placement policies ``fgd`` (FGD, Weng et al., "Beware of Fragmentation", ATC'23)
and ``fgd-lookahead`` (ours: FGD with a look-ahead at the waste it leaves behind): each
worker where fragmentation grows least, by the rule of ``fragmentation``.

The choice is the first node, in registration order, of the least key: the same
decision as sorting every candidate (``ranked``), which ``scan`` still does where a node
refuses what the arrays offered and for gangs (``rank``). At placer speed: the first
request of a kind in a cycle is scored with numpy over the pool (one node per group of
equal nodes); after that the pool's scores (``pool_scores.PoolScores``, with this
policy's ``packed`` keys) keep, per request, each node's best candidate, and a decision
rescores only the nodes changed since (the one it booked, usually), in plain Python
(``node_scores``), bit for bit the numpy scores.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from gpusched.core.model import GpuSlot, WorkerResources
from gpusched.core.state import JobState, NodeState
from gpusched.policies.statement import LentState, Statement
from gpusched.policies.gpu_fit import StateLike, fits_node, pick_gpus
from gpusched.policies.placement.gang import Choice
from gpusched.policies.placement.arrays import arrays_for
from gpusched.policies.placement.fgd.fragmentation import (
    PATIENCE, POPULARITY, candidates, fgd_score, growth)
from gpusched.policies.placement.fgd.node_scores import kept_scorer
from gpusched.policies.placement.fgd.pool_scores import PoolScores
from gpusched.policies.placement.fgd.task_mix import fix_mixes, pool_mix
from gpusched.policies.placement.heuristics import choose_mig, rank_mig


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
        found = view.first(res)
        if found is None:
            return None
        row, gpu = found
        node = view.arrays.nodes[row]
        slots = take(node, pool, res, gpu)
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
            view = statement.views[key] = PoolScores(arrays, mix, self.packed, self.patience, self.lookahead, scorer)
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
