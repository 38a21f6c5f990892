"""A pool's network topology: its levels, a node's domains, and what a job may ask of them.

A pool declares its levels from the top down (``PoolTopologySet``: e.g. ``spine``,
``rack``, ``block``), each the key of a node label. A node's domain at a level is the
path of its labels from the top down to that level, so two racks named ``r1`` under two
spines are two domains. A pool that declares none has ``DEFAULT_LEVELS``: gangs are then
kept in the fewest racks (``rack``), racks of one ``spine`` first, as before levels could
be declared. A node without a level's label is in that level's domain "" of its parent.

A job names levels in its ``TopologyRequest``: ``required`` (all workers in one domain of
the level), ``preferred`` (the fewest domains of the level first) and a ``slice`` (every
``slice.workers`` consecutive workers in one domain of ``slice.level``). The placer plans
with them (``gpusched.policies.placement.topology``); the reducer refuses a placement
that crosses a required domain or splits a slice (``placement_violation``), so no policy
bug can run a job outside what it asked for.
"""
from __future__ import annotations

import re
from typing import Mapping, Sequence

from gpusched.core.model import JobSpec, NodeInfo, TopologyRequest, WorkerAssignment

DEFAULT_LEVELS: tuple[str, ...] = ("spine", "rack")
MAX_LEVELS = 8
# A level is a node label's key: what ``--label key=value`` accepts.
_LEVEL = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._/-]{0,62}[A-Za-z0-9])?")
NO_REQUEST = TopologyRequest()


def pool_levels(declared: Mapping[str, tuple[str, ...]], pool: str) -> tuple[str, ...]:
    """The pool's levels from the top down: as declared, else ``DEFAULT_LEVELS``."""
    return declared.get(pool) or DEFAULT_LEVELS


def domain_path(info: NodeInfo, levels: Sequence[str]) -> tuple[str, ...]:
    """The node's label at each level, top down: its domain at level i is ``path[:i + 1]``."""
    return tuple(info.label(level) for level in levels)


def check_levels(levels: Sequence[str]) -> str:
    """Why ``levels`` cannot be a pool's topology, naming the field; "" when they can
    (an empty list: back to ``DEFAULT_LEVELS``)."""
    if len(levels) > MAX_LEVELS:
        return f"levels: at most {MAX_LEVELS}, got {len(levels)}"
    for i, level in enumerate(levels):
        if not _LEVEL.fullmatch(level):
            return (f"levels[{i}]: a node label key (letters, digits, '.', '_', '/', '-', "
                    f"at most 64), got {level[:70]!r}")
    if len(set(levels)) != len(levels):
        return "levels: a level is repeated"
    return ""


def request_problems(spec: JobSpec, levels: Sequence[str]) -> list[tuple[str, str]]:
    """(field, why) for each part of the job's topology request its pool cannot honour
    with ``levels``: an unknown level, a preferred or slice level above the required one,
    a slice that does not divide the gang."""
    t = spec.topology
    if t == NO_REQUEST:
        return []
    problems = []
    depth = {level: i for i, level in enumerate(levels)}
    known = ", ".join(levels)
    for name, level in (("required", t.required), ("preferred", t.preferred), ("slice.level", t.slice.level)):
        if level and level not in depth:
            problems.append((f"spec.topology.{name}", f"pool {spec.pool} has no level {level!r} (its levels: {known})"))
    if problems:
        return problems
    if t.required and t.preferred and depth[t.preferred] <= depth[t.required]:
        problems.append(("spec.topology.preferred", f"{t.preferred!r} must be below the required level {t.required!r}"))
    if t.required and t.slice.level and depth[t.slice.level] < depth[t.required]:
        problems.append(("spec.topology.slice.level",
                         f"{t.slice.level!r} is above the required level {t.required!r}"))
    return problems


def shape_problems(spec: JobSpec) -> list[tuple[str, str]]:
    """(field, why) for each rule of the request that needs the spec only."""
    t, s = spec.topology, spec.topology.slice
    problems = []
    for name, level in (("required", t.required), ("preferred", t.preferred), ("slice.level", s.level)):
        if level and not _LEVEL.fullmatch(level):
            problems.append((f"spec.topology.{name}", f"a level's name (a node label key), got {level[:70]!r}"))
    if bool(s.level) != bool(s.workers):
        problems.append(("spec.topology.slice", "a slice names both its level and its workers"))
    elif s.workers and (s.workers < 1 or s.workers > spec.workers or spec.workers % s.workers):
        problems.append(("spec.topology.slice.workers",
                         f"must divide the gang's {spec.workers} workers, got {s.workers}"))
    return problems


def placement_violation(spec: JobSpec, nodes: Mapping[str, NodeInfo], levels: Sequence[str],
                        workers: Sequence[WorkerAssignment]) -> str:
    """Why ``workers`` break the job's topology request, or "": a required domain
    crossed, or a slice split over two domains of its level."""
    t = spec.topology
    if t == NO_REQUEST or len(workers) < 2:
        return ""
    depth = {level: i for i, level in enumerate(levels)}
    if t.required in depth:
        cut = depth[t.required] + 1
        domains = {domain_path(nodes[w.node], levels)[:cut] for w in workers}
        if len(domains) > 1:
            return f"the workers span {len(domains)} domains of level {t.required!r}, which the job requires one of"
    if t.slice.level in depth:
        cut, size = depth[t.slice.level] + 1, t.slice.workers
        seen: dict[int, tuple[str, ...]] = {}
        for w in workers:
            path = domain_path(nodes[w.node], levels)[:cut]
            if seen.setdefault(w.worker // size, path) != path:
                return f"slice {w.worker // size} spans two domains of level {t.slice.level!r}"
    return ""
