"""Priority classes, highest first. Configured per cluster; these are the defaults."""
from __future__ import annotations

PRIORITY_CLASSES: dict[str, int] = {
    "production-inference": 1000,
    "training-high": 500,
    "training": 100,
    "best-effort": 0,
}


def priority_value(name: str) -> int:
    return PRIORITY_CLASSES.get(name, 0)
