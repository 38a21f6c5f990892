"""The placement policies by name: one explicit map, chosen by configuration.

Each entry is the policy's class; its constructor's keyword arguments are the policy's
settings, typed and checked there (``fgd-lookahead``'s ``patience``, FGD's
``popularity``), with the defaults the documentation's figures use. Nothing registers
itself on import: a policy exists when it is listed here.
"""
from __future__ import annotations

from typing import Callable

from gpusched.policies.placement.fragmentation import Fgd, FgdLookahead
from gpusched.policies.placement.gang import Placement
from gpusched.policies.placement.heuristics import BestFit, DotProduct, GpuClustering, GpuPacking, RandomPlacement

PLACEMENTS: dict[str, Callable[..., Placement]] = {
    "best-fit": BestFit,
    "random": RandomPlacement,
    "dot-product": DotProduct,
    "gpu-packing": GpuPacking,
    "gpu-clustering": GpuClustering,
    "fgd": Fgd,
    "fgd-lookahead": FgdLookahead,
}


def make_placement(name: str, **settings: float) -> Placement:
    """The policy ``name`` with ``settings`` (its constructor's keyword arguments)."""
    factory = PLACEMENTS.get(name)
    if factory is None:
        raise ValueError(f"unknown placement policy {name!r}; known: {sorted(PLACEMENTS)}")
    return factory(**settings)
