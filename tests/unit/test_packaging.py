"""Every package folder of gpusched is in pyproject.toml's package list, or the wheel
ships without it and an installed service fails to import it (tests/deployment finds
that only after building wheels)."""
from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_package_folder_is_listed():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "gpusched").rglob("__init__.py")}
    assert folders - listed == set()
