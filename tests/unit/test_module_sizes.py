"""Rooms of a readable size: no module of gpusched over MAX_LINES lines unless this file
says why. An entry whose module has shrunk below the limit must go (so the list stays
true)."""
from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "gpusched"
MAX_LINES = 400

# module (relative to gpusched/) -> why it may be longer
LONGER = {
    "core/reducer.py": "one handler per event type: the only place the state is written, read as one table",
    "core/snapshot.py": "the column codec of every state dataclass, its schema checks and the consistency "
                        "check of a restored state: one format, read together",
    "config.py": "the one configuration model: every service's settings declared once, with the "
                 "machinery that turns them into flags and variables (docs/configuration.md mirrors it)",
}


def _sizes() -> dict[str, int]:
    return {str(path.relative_to(PACKAGE)): len(path.read_text().splitlines())
            for path in PACKAGE.rglob("*.py") if not {"v1", "_native"} & set(path.relative_to(PACKAGE).parts)}


def over(sizes: dict[str, int]) -> list[str]:
    return sorted(f"{name}: {lines} lines" for name, lines in sizes.items() if lines > MAX_LINES and name not in LONGER)


def test_no_module_is_longer_than_the_limit_without_a_reason():
    assert over(_sizes()) == []


def test_every_reason_is_still_needed():
    sizes = _sizes()
    assert [name for name in LONGER if sizes.get(name, 0) <= MAX_LINES] == []


def test_a_long_module_without_a_reason_fails():
    assert over({"adapters/follower.py": MAX_LINES + 1, "core/reducer.py": 900}) == \
        [f"adapters/follower.py: {MAX_LINES + 1} lines"]
