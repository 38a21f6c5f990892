"""The package's import graph keeps its layers (docs/design/architecture.md, "Where the code lives"):
no import cycles, and no arrow upward in

    gpusched.native, gpusched.config, gpusched.version  <-  gpusched.core  <-  gpusched.policies
        <-  gpusched.adapters (and the generated gpusched.v1)  <-  the rest of gpusched
        (entry points, consumers, simulator)  <-  services/*

Every ``import`` counts, also one inside a function (a lazy import is still an arrow);
only those under ``if TYPE_CHECKING:`` do not.
"""
from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Cycles known and being removed elsewhere: each entry is one strongly connected set of
# modules, allowed exactly as it stands (a bigger or different cycle still fails).
KNOWN_CYCLES: dict[str, frozenset[str]] = {}   # none: a cycle added here needs its reason

# Rank of each layer: a module may import only modules of its own rank or below.
RANKS = {"gpusched.native": 0, "gpusched.config": 0, "gpusched.version": 0, "gpusched.core": 1, "gpusched.policies": 2,
         "gpusched.adapters": 3, "gpusched.v1": 3}
ENTRY_RANK = 4      # the rest of gpusched: CLI, consumers, simulator, local cluster
SERVICE_RANK = 5    # services/* (packages gpusched_<service>)
# What the pure core never imports, whatever the layer rules say.
CORE_FORBIDDEN = ("aiokafka", "grpc", "google.protobuf", "pynvml", "kafka", "opentelemetry")


def rank(module: str) -> int:
    if module.startswith("gpusched_"):
        return SERVICE_RANK
    for prefix, r in RANKS.items():
        if module == prefix or module.startswith(prefix + "."):
            return r
    return ENTRY_RANK


@cache
def modules() -> dict[str, Path]:
    """gpusched's modules (generated code aside) and the services' modules, by name."""
    found = {}
    for path in (ROOT / "gpusched").rglob("*.py"):
        rel = path.relative_to(ROOT).with_suffix("").parts
        if rel[1] in ("v1", "_native"):
            continue
        found[".".join(rel[:-1] if rel[-1] == "__init__" else rel)] = path
    for path in (ROOT / "services").rglob("*.py"):
        service = path.relative_to(ROOT / "services").parts[0]
        package = "gpusched_" + service.replace("-", "_")
        stem = path.stem
        found[package if stem == "__init__" else f"{package}.{stem}"] = path
    return found


def imports(tree: ast.AST, module: str) -> set[str]:
    """The modules ``tree`` imports (absolute names; ``from a import b`` is ``a.b`` when
    that is a module, else ``a``), leaving out ``if TYPE_CHECKING:`` blocks."""
    known = modules()
    out: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:   # relative: from the module's package
                package = module.split(".")[: -node.level] if not module_is_package(module) else \
                    module.split(".")[: len(module.split(".")) - node.level + 1]
                base = ".".join(package + ([base] if base else []))
            for alias in node.names:
                name = f"{base}.{alias.name}"
                out.add(name if name in known else base)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return out


def module_is_package(module: str) -> bool:
    return modules()[module].name == "__init__.py"


def graph(extra: dict[str, set[str]] | None = None) -> dict[str, set[str]]:
    """Module -> the project's modules it imports (plus ``extra`` arrows, for tests of this test)."""
    known = modules()
    edges = {m: {t for t in imports(ast.parse(p.read_text()), m) if t in known and t != m} for m, p in known.items()}
    for m, targets in (extra or {}).items():
        edges.setdefault(m, set()).update(targets)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected sets of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for v in sorted(edges):
        if v not in index:
            connect(v)
    return found


def unknown_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    allowed = set(KNOWN_CYCLES.values())
    return [sorted(c) for c in cycles(edges) if c not in allowed]


def upward_arrows(edges: dict[str, set[str]]) -> list[str]:
    return sorted(f"{m} -> {t}" for m, targets in edges.items() for t in targets if rank(t) > rank(m))


def test_no_import_cycles():
    assert unknown_cycles(graph()) == []


def test_no_upward_imports():
    assert upward_arrows(graph()) == []


def test_the_core_imports_no_infrastructure():
    found = []
    for m, path in modules().items():
        if rank(m) == RANKS["gpusched.core"]:
            found += [f"{m} -> {t}" for t in imports(ast.parse(path.read_text()), m)
                      if t.split(".")[0] in CORE_FORBIDDEN or t.startswith(CORE_FORBIDDEN)]
    assert found == []


def test_the_known_cycles_still_exist():
    """An entry for a cycle that is gone would let it come back unnoticed: delete it."""
    present = set(cycles(graph()))
    assert [name for name, c in KNOWN_CYCLES.items() if c not in present] == []


# --- the checks catch what they are for -------------------------------------------------
@pytest.mark.parametrize("source, target", [
    ("gpusched.core.state", "gpusched.policies.queueing.order"),
    ("gpusched.core.reducer", "gpusched.adapters.log.codec"),
    ("gpusched.policies.queueing.order", "gpusched.adapters.log.follower"),
    ("gpusched.adapters.log.follower", "gpusched.local_cluster"),
    ("gpusched.adapters.service", "gpusched_placer.main"),
    ("gpusched.config", "gpusched.adapters.broker.kafka_admin"),
])
def test_an_upward_import_fails(source, target):
    assert f"{source} -> {target}" in upward_arrows(graph({source: {target}}))


def test_a_new_cycle_fails():
    edges = graph({"gpusched.adapters.log.codec": {"gpusched.adapters.log.publisher"}})   # publisher imports codec
    assert ["gpusched.adapters.log.codec", "gpusched.adapters.log.publisher"] in unknown_cycles(edges)


def test_a_known_cycle_grown_bigger_fails():
    edges = graph({"gpusched.policies.placement.gang": {"gpusched.policies.scheduler"}})   # scheduler imports placement
    assert unknown_cycles(edges) != []


def test_imports_are_read_from_functions_and_not_from_type_checking_blocks():
    tree = ast.parse("from typing import TYPE_CHECKING\n"
                     "if TYPE_CHECKING:\n    from gpusched.adapters.log import follower\n"
                     "def f():\n    from gpusched.adapters.log import codec\n")
    found = imports(tree, "gpusched.core.state")
    assert "gpusched.adapters.log.codec" in found and "gpusched.adapters.log.follower" not in found
