"""Test modules never import each other: a helper that several test modules share lives
in a support module (a name not starting with ``test_``, such as
``tests/unit/policies/preemption_clusters.py`` or ``tests/integration/cluster_calls.py``),
and a fixture in the nearest ``conftest.py``. A test module imported by another runs its
module-level code twice over, and its tests get collected where they are imported.

Every ``.py`` under tests/ is read with ``ast``; any import of a module whose last dotted
part starts with ``test_`` fails, naming the file and line: ``import tests.x.test_y``,
``from tests.x.test_y import z``, the relative forms (``from .test_y import z``,
``from ..x.test_y import z``) and ``from tests.x import test_y``; a ``conftest.py`` counts as a test module. An import
inside a function counts too.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]


def is_test_module(dotted: str) -> bool:
    """A test module, or a ``conftest.py`` (pytest loads it as a plugin: imported again,
    its fixtures exist twice)."""
    last = dotted.rsplit(".", 1)[-1]
    return last.startswith("test_") or last == "conftest"


def imports_of_test_modules(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, module) for each import in ``tree`` of a test module."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names if is_test_module(alias.name)]
        elif isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            if node.module and is_test_module(node.module):
                found.append((node.lineno, module))
            else:   # ``from tests.x import test_y``: the name may be the module itself
                found += [(node.lineno, f"{module.rstrip('.')}.{alias.name}" if node.module else module + alias.name)
                          for alias in node.names if is_test_module(alias.name)]
    return found


def test_no_test_module_imports_another():
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        for line, module in imports_of_test_modules(ast.parse(path.read_text(), str(path))):
            found.append(f"{path.relative_to(TESTS.parent)}:{line}: imports {module}")
    assert found == [], "test modules import test modules (move the helper to a support module):\n" + \
        "\n".join(found)


# --- the check catches what it is for -----------------------------------------------------
@pytest.mark.parametrize("source, module", [
    ("from tests.unit.policies.test_preemption import Cluster", "tests.unit.policies.test_preemption"),
    ("import tests.integration.test_fault_tolerance", "tests.integration.test_fault_tolerance"),
    ("import tests.integration.test_fault_tolerance as ft", "tests.integration.test_fault_tolerance"),
    ("from .test_snapshot import _sample_state", ".test_snapshot"),
    ("from ..core.test_core_properties import History", "..core.test_core_properties"),
    ("from tests.unit.policies import test_defrag", "tests.unit.policies.test_defrag"),
    ("from . import test_codec", ".test_codec"),
    ("from tests.conftest import start_private_cluster", "tests.conftest"),
    ("def f():\n    from tests.unit.policies.test_defrag import fragmented", "tests.unit.policies.test_defrag"),
])
def test_an_import_of_a_test_module_is_found(source, module):
    assert [m for _, m in imports_of_test_modules(ast.parse(source))] == [module]


@pytest.mark.parametrize("source", [
    "from tests.unit.policies.preemption_clusters import Cluster",
    "from tests.unit.core.builders import make_node",
    "from .builders import make_spec",
    "import tests.integration.cluster_calls",
    "from tests.unit.policies import preemption_oracle",
])
def test_an_import_of_a_support_module_passes(source):
    assert imports_of_test_modules(ast.parse(source)) == []
