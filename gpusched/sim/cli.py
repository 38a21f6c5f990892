"""``gpusched simulate <kind> ...``: the simulators, by kind."""
from __future__ import annotations

import importlib
import sys

KINDS = {
    "static": ("gpusched.sim.static", "the FGD paper's static packing benchmark on the openb trace"),
    "dynamic": ("gpusched.sim.dynamic", "trace-driven simulation over time (arrivals and departures)"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in KINDS:
        print("usage: gpusched simulate <kind> [args]   (--help after the kind for its options)\n\nkinds:")
        for name, (_, help_text) in KINDS.items():
            print(f"  {name:<8} {help_text}")
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    return importlib.import_module(KINDS[argv[0]][0]).main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
