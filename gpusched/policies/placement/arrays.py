"""A numpy mirror of one pool's nodes, for policies that score every node at once.

Rows follow registration order (the order of ``state.nodes``), so ``argmin``/stable sorts
break ties the way every policy does. Built once per cycle on the cycle's ``Statement``
and refreshed row by row for the nodes the statement changes (bookings, holds,
nominations). A node that is not ready, and a GPU
that is unhealthy, cut into MIG or MIG-enabled, offer nothing here; MIG requests are placed through
the MIG index (``heuristics.choose_mig``, ``mig_index``), not from these arrays.
"""
from __future__ import annotations

from typing import Iterable, Mapping

import numpy as np

from gpusched.core.capacity import offered_gpus
from gpusched.core.model import WorkerResources
from gpusched.core.state import NodeState
from gpusched.policies.statement import Statement


class NodeArrays:
    def __init__(self, nodes: Mapping[str, NodeState], pool: str) -> None:
        self.nodes = [n for n in nodes.values() if n.info.pool == pool]
        self.row = {n.name: i for i, n in enumerate(self.nodes)}
        self.models = sorted({n.model for n in self.nodes})
        width = max((len(n.gpus) for n in self.nodes), default=0)
        count = len(self.nodes)
        # The columns, written for changed rows only when next read (``_flush``): FGD
        # rescores the rows a booking changes from ``plain`` and reads the columns for a
        # new request only, so most bookings never pay numpy's per-call cost.
        self._cpu = np.zeros(count, dtype=np.int64)       # free CPU milli (-1: not ready)
        self._mem = np.zeros(count, dtype=np.int64)       # free memory MiB
        self._gpu = np.zeros((count, width), dtype=np.int64)   # free milli of each GPU
        # Free memory MiB of each GPU, for shares that ask for GPU memory (0 where the GPU
        # offers nothing): what ``GpuState.fits_share`` checks besides the milli.
        self._gmem = np.zeros((count, width), dtype=np.int64)
        self._idle = np.zeros(count, dtype=bool)          # nothing runs or is booked on it
        self._dirty: set[int] = set()                     # rows whose columns lag ``plain``
        self.ngpu = np.array([len(n.gpus) for n in self.nodes], dtype=np.int64)
        self.model = np.array([self.models.index(n.model) for n in self.nodes], dtype=np.int64)
        self._allowed: dict[tuple[str, ...], np.ndarray] = {}
        self._models_allowed: dict[tuple[str, ...], list[bool]] = {}
        self._pad = (0,) * width
        # Each row's values as Python ints too: (free milli per GPU, CPU, memory, idle, free
        # GPU memory per GPU), for policies that rescore a few rows in plain Python (numpy's
        # cost is per call).
        self.plain: list[tuple[tuple[int, ...], int, int, bool, tuple[int, ...]]] = [((), 0, 0, False, ())] * count
        for i in range(count):
            self._refresh(i)
        self._flush()

    @property
    def cpu(self) -> np.ndarray:
        if self._dirty:
            self._flush()
        return self._cpu

    @property
    def mem(self) -> np.ndarray:
        if self._dirty:
            self._flush()
        return self._mem

    @property
    def gpu(self) -> np.ndarray:
        if self._dirty:
            self._flush()
        return self._gpu

    @property
    def gmem(self) -> np.ndarray:
        if self._dirty:
            self._flush()
        return self._gmem

    @property
    def idle(self) -> np.ndarray:
        if self._dirty:
            self._flush()
        return self._idle

    def touch(self, names: Iterable[str]) -> None:
        for name in names:
            i = self.row.get(name)
            if i is not None:
                self._refresh(i)

    def _refresh(self, i: int) -> None:
        node = self.nodes[i]
        gpu, gmem = offered_gpus(node)
        pad = self._pad[len(gpu):]
        if pad:   # a node narrower than the widest
            gpu, gmem = (*gpu, *pad), (*gmem, *pad)
        self.plain[i] = (gpu, node.free_cpu if node.schedulable else -1, node.free_mem, not node.jobs, gmem)
        self._dirty.add(i)

    def _flush(self) -> None:
        """Write the changed rows' ``plain`` values into the columns, one call a column."""
        rows = sorted(self._dirty)
        self._dirty.clear()
        if not rows:
            return
        gpu, cpu, mem, idle, gmem = zip(*[self.plain[i] for i in rows])
        self._cpu[rows], self._mem[rows], self._idle[rows] = cpu, mem, idle
        self._gpu[rows], self._gmem[rows] = gpu, gmem

    def allowed_models(self, res: WorkerResources) -> list[bool]:
        """Per model (``models``), whether ``res`` accepts it."""
        key = res.gpu_models
        ok = self._models_allowed.get(key)
        if ok is None:
            ok = self._models_allowed[key] = [res.allows(m) for m in self.models]
        return ok

    def allowed(self, res: WorkerResources) -> np.ndarray:
        """Rows whose GPU model ``res`` accepts (every row for a model-free request)."""
        key = res.gpu_models
        mask = self._allowed.get(key)
        if mask is None:
            ok = np.array([res.allows(m) for m in self.models], dtype=bool)
            mask = self._allowed[key] = ok[self.model] if len(self.models) else np.zeros(0, bool)
        return mask

    def feasible(self, res: WorkerResources, rows: np.ndarray | None = None) -> np.ndarray:
        """Rows (of ``rows``, sorted, by default all) with room for one worker of ``res``
        (not MIG), in registration order."""
        if rows is None:
            cpu, mem, gpu, allowed = self.cpu, self.mem, self.gpu, self.allowed(res)
        else:
            cpu, mem, gpu, allowed = self.cpu[rows], self.mem[rows], self.gpu[rows], self.allowed(res)[rows]
        ok = (cpu >= res.cpu_milli) & (mem >= res.memory_mib) & allowed
        if res.is_share:
            ok &= (gpu >= res.gpu_milli).any(axis=1)
        elif res.gpus:
            ok &= (gpu == 1000).sum(axis=1) >= res.gpus
        return np.flatnonzero(ok) if rows is None else rows[ok]


def arrays_for(statement: Statement, nodes: Mapping[str, NodeState], pool: str) -> NodeArrays:
    """The cycle's mirror of ``pool``, built on first use."""
    key = ("arrays", pool)
    view = statement.views.get(key)
    if view is None:
        view = statement.views[key] = NodeArrays(nodes, pool)
    return view
