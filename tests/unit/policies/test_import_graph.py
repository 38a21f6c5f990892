"""The policies import one another without cycles: every module can be read after the
ones it imports, and none is completed by another's import side effect."""
from __future__ import annotations

import ast
from pathlib import Path

import gpusched.policies

PACKAGE = "gpusched.policies"


def imports_of(path: Path) -> set[str]:
    """The ``gpusched.policies`` modules ``path`` imports, wherever in the file."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == PACKAGE:   # ``from gpusched.policies import x``
                found |= {f"{PACKAGE}.{a.name}" for a in node.names}
            elif node.module.startswith(PACKAGE + "."):
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith(PACKAGE + ".")}
    return found


def graph() -> dict[str, set[str]]:
    root = Path(gpusched.policies.__file__).parent
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        name = ".".join((PACKAGE, *parts)).removesuffix(".__init__")
        modules[name] = path
    return {name: {m for m in imports_of(path) if m in modules} for name, path in modules.items()}


def cycle(edges: dict[str, set[str]]) -> list[str]:
    """One import cycle, or [] when there is none (depth-first search)."""
    state: dict[str, int] = {}   # 1: on the current path, 2: done
    path: list[str] = []

    def visit(name: str) -> list[str]:
        state[name] = 1
        path.append(name)
        for nxt in sorted(edges[name]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[name] = 2
        return []

    for name in sorted(edges):
        if name not in state and (found := visit(name)):
            return found
    return []


def test_policies_import_no_cycle():
    assert cycle(graph()) == []


def test_the_check_sees_a_cycle():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) == []
