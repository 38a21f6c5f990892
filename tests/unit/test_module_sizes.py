"""Rooms of a readable size: no module of gpusched, bench/ or services/ over MAX_LINES
lines. Only the package's modules may be longer, where this file says why; an entry whose
module has shrunk below the limit must go (so the list stays true)."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TREES = ("gpusched", "bench", "services")
GENERATED = {"v1", "_native"}   # protobuf stubs and the mypyc build
MAX_LINES = 400

# module (relative to the repository) -> why it may be longer
LONGER = {
    "gpusched/core/reducer.py": "one handler per event type: the only place the state is written, read as one table",
    "gpusched/core/snapshot.py": "the column codec of every state dataclass, its schema checks and the consistency "
                                 "check of a restored state: one format, read together",
    "gpusched/config.py": "the one configuration model: every service's settings declared once, with the "
                          "machinery that turns them into flags and variables (docs/configuration.md mirrors it)",
}


def _sizes() -> dict[str, int]:
    return {str(path.relative_to(ROOT)): len(path.read_text().splitlines())
            for tree in TREES for path in (ROOT / tree).rglob("*.py")
            if not GENERATED & set(path.relative_to(ROOT).parts)}


def over(sizes: dict[str, int]) -> list[str]:
    return sorted(f"{name}: {lines} lines" for name, lines in sizes.items() if lines > MAX_LINES and name not in LONGER)


def test_no_module_is_longer_than_the_limit_without_a_reason():
    assert over(_sizes()) == []


def test_every_reason_is_still_needed():
    sizes = _sizes()
    assert [name for name in LONGER if sizes.get(name, 0) <= MAX_LINES] == []


def test_only_the_package_has_reasons():
    assert [name for name in LONGER if not name.startswith("gpusched/")] == []


def test_the_benchmarks_and_services_are_measured():
    sizes = _sizes()
    assert "bench/replay_bench.py" in sizes and "services/admission/servicer.py" in sizes
    assert not any("/v1/" in name or "/_native/" in name for name in sizes)


def test_a_long_module_without_a_reason_fails():
    assert over({"gpusched/adapters/follower.py": MAX_LINES + 1, "gpusched/core/reducer.py": 900,
                 "bench/replay_bench.py": MAX_LINES + 1}) == \
        [f"bench/replay_bench.py: {MAX_LINES + 1} lines", f"gpusched/adapters/follower.py: {MAX_LINES + 1} lines"]
