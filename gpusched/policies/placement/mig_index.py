"""An index of a pool's MIG nodes by where one MIG profile fits, so a MIG request looks
only at the nodes that can take it instead of scanning the pool (``FreeIndex`` does the
same for whole GPUs and shares).

``heuristics.choose_mig`` prefers, among the nodes where the slice fits, a node whose
slice goes on a GPU already cut into MIG (whole GPUs stay whole), then the tightest node
by best-fit's key (``free CPU milli + gpu_weight x free GPU milli``), then registration
order. ``pick_mig`` puts a slice on a cut GPU whenever one has a free start for it, so a
node's *class* for a profile is 0 when a cut GPU has a free start, 1 when only an uncut
GPU has one; a node with no free start for the profile, or not ready, is in no bucket.
Each bucket (GPU model, class) is a list sorted by (key, registration order). A request
merges the class-0 buckets of the models it allows, then the class-1 ones, from the key's
lower bound up (the key is at least the free CPU, so at least the request's CPU), and
stops at the first node that really fits (CPU, memory: checked on the node itself): the
same answer as scanning every node in preference order.

One index per pool and profile lives on a ``Statement``: built from the nodes once,
then told by the statement about each node it changes, and kept between cycles
(``kept_index``), as ``FreeIndex`` is.
Only nodes with a MIG-capable GPU are kept; a touch of any other node costs two lookups.
"""
from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections import defaultdict
from itertools import islice
from typing import Callable, Iterable, Iterator, Mapping

from gpusched.core.mig import MigProfile
from gpusched.core.model import WorkerResources
from gpusched.core.state import NodeState
from gpusched.policies.placement.index import gpu_free, renew_members

CUT, UNCUT = 0, 1                # a node's class for a profile: where its slice would go
Entry = tuple[int, int, str]     # (key, registration order, node name)
Bucket = tuple[str, int]         # (GPU model, class)


def mig_class(node: NodeState, profile: MigProfile) -> int | None:
    """CUT when a GPU already cut into MIG has a free start for ``profile``, UNCUT when
    only an uncut GPU has one, None when no GPU has (what ``pick_mig`` would choose from)."""
    uncut = False
    for g in node.gpus:
        if g.takes_mig() and any(g.fits_mig(profile, start) for start in profile.starts):
            if g.mig_mask:
                return CUT
            uncut = True
    return UNCUT if uncut else None


class MigIndex:
    def __init__(self, nodes: Mapping[str, NodeState], pool: str, profile: MigProfile, gpu_weight: int) -> None:
        self.nodes, self.pool, self.profile, self.gpu_weight = nodes, pool, profile, gpu_weight
        self.buckets: dict[Bucket, list[Entry]] = defaultdict(list)
        self.where: dict[str, tuple[Entry, Bucket]] = {}
        self.seq: dict[str, int] = {}   # the pool's MIG nodes' registration order
        for seq, node in enumerate(nodes.values()):
            if self._member(node):
                self.seq[node.name] = seq
                self._place(node, seq, insert=list.append)
        for bucket in self.buckets.values():
            bucket.sort()

    def renew(self, names: Iterable[str]) -> None:
        """``names`` may have registered: which are MIG nodes of the pool again (``touch``
        them next)."""
        renew_members(self.seq, self.nodes, names, self._member)

    def _member(self, node: NodeState) -> bool:
        return node.info.pool == self.pool and any(g.info.mig_capable for g in node.gpus)

    def touch(self, names: Iterable[str]) -> None:
        for name in names:
            old = self.where.pop(name, None)
            if old is not None:
                entry, bucket = old
                entries = self.buckets[bucket]
                del entries[bisect_left(entries, entry)]
            seq = self.seq.get(name)
            if seq is not None:   # else not a MIG node of this pool (or no longer): not in the index
                self._place(self.nodes[name], seq, insert=insort)

    def _place(self, node: NodeState, seq: int, insert: Callable) -> None:
        if not node.schedulable:
            return   # a cordoned or lost node leaves the index
        klass = mig_class(node, self.profile)
        if klass is None:
            return
        entry = (node.free_cpu + self.gpu_weight * gpu_free(node)[2], seq, node.name)
        bucket = (node.model, klass)
        insert(self.buckets[bucket], entry)
        self.where[node.name] = (entry, bucket)

    def candidates(self, res: WorkerResources, low: int) -> Iterator[NodeState]:
        """Nodes with a free start for one slice of ``res``, in ``choose_mig``'s order:
        class, then key ``>= low``, then registration order."""
        for klass in (CUT, UNCUT):
            starts = [islice(b, bisect_left(b, (low,)), None)
                      for (model, k), b in self.buckets.items() if k == klass and b and res.allows(model)]
            merged = starts[0] if len(starts) == 1 else heapq.merge(*starts)
            for _, _, name in merged:
                yield self.nodes[name]
