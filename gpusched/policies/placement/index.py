"""An index of a pool's free capacity, so best-fit finds the tightest node without a scan.

Every node sits in two buckets: by GPU model and number of free whole GPUs, and by model
and its largest free share of one GPU (in steps of 100 milli). Each bucket is a list
sorted by the node's key, ``free CPU milli + gpu_weight x free GPU milli`` (lower first),
then registration order. A request merges only the buckets that can hold it, from the
key's lower bound up, and stops at the first node that really fits (ready, CPU, memory,
healthy GPUs: checked on the node itself), so the answer is the same as scanning every
node in key order.

The index lives on a ``Statement``: built from the nodes once, then told by the
statement about each node it changes (a booking, a hold, a nomination's cordon). A
scheduler cycle with ``QueueKeys`` keeps it for the next cycle (``kept_index``).
"""
from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections import defaultdict
from itertools import islice
from typing import Callable, Iterable, Iterator, Mapping

from gpusched.core.model import GpuSlot, WorkerResources
from gpusched.core.state import NodeState
from gpusched.policies.journal_cursor import registration_order

SHARE_STEP = 100                 # milli per share bucket; 11 buckets, 0..1000
Entry = tuple[int, int, str]     # (key, registration order, node name)
Bucket = tuple[str, int]         # (GPU model, free whole GPUs or largest share // SHARE_STEP)


def gpu_free(node: NodeState) -> tuple[int, int, int]:
    """(free whole GPUs, largest free share of one GPU, free GPU milli) of healthy GPUs
    not cut into MIG (nor MIG-enabled)."""
    whole = largest = total = 0
    for g in node.gpus:
        if g.healthy and not g.mig_mask and g.whole_ok:
            free = 1000 - g.used_milli
            total += free
            if free == 1000:
                whole += 1
            if free > largest:
                largest = free
    return whole, largest, total


def renew_members(seq: dict[str, int], nodes: Mapping[str, NodeState], names: Iterable[str],
                  member: Callable[[NodeState], bool]) -> None:
    """An index's rows (``seq``: member -> registration order) after ``names`` may have
    registered: a node that is a ``member`` now joins, one that is not leaves."""
    for name in names:
        node = nodes.get(name)
        if node is not None and member(node):
            if name not in seq:
                seq[name] = registration_order(nodes, name)
        else:
            seq.pop(name, None)


class FreeIndex:
    def __init__(self, nodes: Mapping[str, NodeState], pool: str, gpu_weight: int) -> None:
        self.nodes, self.pool, self.gpu_weight = nodes, pool, gpu_weight
        self.whole: dict[Bucket, list[Entry]] = defaultdict(list)
        self.share: dict[Bucket, list[Entry]] = defaultdict(list)
        self.where: dict[str, tuple[Entry, Bucket, Bucket]] = {}
        self.models: set[str] = set()
        self.seq: dict[str, int] = {}   # the pool's nodes' registration order
        for seq, node in enumerate(nodes.values()):
            if node.info.pool == pool:
                self.seq[node.name] = seq
                if node.schedulable:
                    self._place(node, seq, insert=list.append)
        for bucket in (*self.whole.values(), *self.share.values()):
            bucket.sort()

    def renew(self, names: Iterable[str]) -> None:
        """``names`` may have registered (added, or into or out of the pool): their
        membership again; ``touch`` them next to place them."""
        renew_members(self.seq, self.nodes, names, lambda node: node.info.pool == self.pool)

    def touch(self, names: Iterable[str]) -> None:
        for name in names:
            old = self.where.pop(name, None)
            if old is not None:
                entry, wkey, skey = old
                for bucket in (self.whole[wkey], self.share[skey]):
                    del bucket[bisect_left(bucket, entry)]
            seq = self.seq.get(name)
            if seq is not None and self.nodes[name].schedulable:   # a cordoned node leaves the index
                self._place(self.nodes[name], seq, insert=insort)

    def _place(self, node: NodeState, seq: int, insert: Callable) -> None:
        whole, largest, total = gpu_free(node)
        entry = (node.free_cpu + self.gpu_weight * total, seq, node.name)
        wkey, skey = (node.model, whole), (node.model, largest // SHARE_STEP)
        insert(self.whole[wkey], entry)
        insert(self.share[skey], entry)
        self.where[node.name] = (entry, wkey, skey)
        self.models.add(node.model)

    def candidates(self, res: WorkerResources, low: int) -> Iterator[NodeState]:
        """Nodes that may hold one worker of ``res`` (not MIG), key ``>= low`` first."""
        gpu = res.gpus or res.is_share
        models = [m for m in self.models if res.allows(m) and (m or not gpu)]
        if res.is_share:
            first = res.gpu_milli // SHARE_STEP
            buckets = [b for (m, s), b in self.share.items() if s >= first and b and m in models]
        else:
            buckets = [b for (m, w), b in self.whole.items() if w >= res.gpus and b and m in models]
        starts = [islice(b, bisect_left(b, (low,)), None) for b in buckets]
        if not starts:
            return
        merged = starts[0] if len(starts) == 1 else heapq.merge(*starts)
        for _, _, name in merged:
            yield self.nodes[name]


def holding(index: FreeIndex, res: WorkerResources) -> Iterator[str]:
    """Names of the schedulable nodes with at least ``res.gpus`` free whole GPUs of a model
    ``res`` allows (a whole-GPU request), in no particular order: every node that may take
    one worker of ``res`` is among them."""
    for (model, free), bucket in index.whole.items():
        if free >= res.gpus and bucket and res.allows(model):
            for _, _, name in bucket:
                yield name


def first_fit(index: FreeIndex, res: WorkerResources, low: int,
              fit: Callable[[NodeState, str, WorkerResources], tuple[GpuSlot, ...] | None],
              ) -> tuple[NodeState, tuple[GpuSlot, ...]] | None:
    for node in index.candidates(res, low):
        slots = fit(node, index.pool, res)
        if slots is not None:
            return node, slots
    return None
