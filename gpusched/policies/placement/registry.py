"""The placement policies by name: one explicit map, chosen by configuration.

Each entry is the policy's class; its constructor's keyword arguments are the policy's
settings, typed and checked there (``fgd-lookahead``'s ``patience``, FGD's
``popularity``), with the defaults the documentation's figures use. Nothing registers
itself on import: a policy exists when it is listed here.
"""
from __future__ import annotations

import functools
import inspect
from typing import Callable

from gpusched.policies.placement.fgd.policy import Fgd, FgdLookahead
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


def placement_arguments(name: str) -> dict[str, float]:
    """The arguments policy ``name`` takes, with their defaults."""
    factory = PLACEMENTS.get(name)
    if factory is None:
        raise ValueError(f"unknown placement policy {name!r}; known: {sorted(PLACEMENTS)}")
    return dict(_arguments(factory))


@functools.cache
def _arguments(factory: Callable[..., Placement]) -> tuple[tuple[str, float], ...]:
    # Once per policy: the preemptor makes a placement every round, and reading a compiled
    # class's signature parses its text each time.
    return tuple((p.name, p.default) for p in inspect.signature(factory).parameters.values()
                 if p.kind is p.KEYWORD_ONLY or p.kind is p.POSITIONAL_OR_KEYWORD)


def make_placement(name: str, **settings: float) -> Placement:
    """The policy ``name`` with ``settings`` (its constructor's keyword arguments); an
    unknown name or argument, or a value out of range, is a ValueError naming it."""
    known = placement_arguments(name)
    for key in settings:
        if key not in known:
            raise ValueError(f"placement policy {name!r} has no argument {key!r}; "
                             f"its arguments: {', '.join(sorted(known)) or 'none'}")
    return PLACEMENTS[name](**settings)


def parse_placement(text: str) -> tuple[str, dict[str, float]]:
    """``name[:key=value...]`` (the simulators' notation, e.g. ``fgd-lookahead:patience=0.2``)
    as the policy's name and arguments; a ValueError names what is wrong."""
    name, *items = text.split(":")
    known = placement_arguments(name)
    args: dict[str, float] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"expected key=value after {name!r}, not {item!r}")
        if key not in known:
            raise ValueError(f"placement policy {name!r} has no argument {key!r}; "
                             f"its arguments: {', '.join(sorted(known)) or 'none'}")
        try:
            args[key] = float(value)
        except ValueError:
            raise ValueError(f"{name}'s argument {key!r} must be a number, not {value!r}") from None
    return name, args
