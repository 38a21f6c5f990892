"""The oracle for the MIG index: ``choose_mig`` as it was before MIG placement was indexed,
a scan of every node, frozen here and kept only in the tests (the product has one code
path, the index). ``tests/unit/policies/placement/test_mig_index.py`` compares the index's decisions
with it; ``bench/mig_placement_bench.py`` measures it as the baseline.
"""
from __future__ import annotations

from contextlib import ExitStack, contextmanager
from typing import Callable, Iterator, Mapping
from unittest.mock import patch

from gpusched.core.model import WorkerResources
from gpusched.core.state import NodeState
from gpusched.policies.gpu_fit import fit
from gpusched.policies.placement import heuristics
from gpusched.policies.placement.fgd import policy as fgd_policy
from gpusched.policies.placement.heuristics import best_fit_key


def scan_choose_mig(nodes: Mapping[str, NodeState], pool: str, res: WorkerResources,
                    key: Callable[[NodeState], int] = best_fit_key):
    """A MIG slice on the tightest node, preferring GPUs already cut (keeps whole GPUs
    whole); ties by registration order. Every node of ``nodes`` is looked at."""
    best = None
    for seq, node in enumerate(nodes.values()):
        slots = fit(node, pool, res)
        if slots is not None:
            rank = (node.gpus[slots[0].index].mig_mask == 0, key(node), seq)
            if best is None or rank < best[0]:
                best = (rank, node, slots)
    return (best[1], best[2]) if best else None


@contextmanager
def scanning() -> Iterator[list[str]]:
    """Every policy places MIG slices by the scan instead of the index while the block
    runs; yields the profiles the scan was asked for (proof that it was called)."""
    calls: list[str] = []

    def scan(statement, nodes, pool, res):
        calls.append(res.mig_profile)
        return scan_choose_mig(nodes, pool, res)

    with ExitStack() as stack:
        for module in (heuristics, fgd_policy):   # the modules that call choose_mig
            if hasattr(module, "choose_mig"):
                stack.enter_context(patch.object(module, "choose_mig", scan))
        yield calls
