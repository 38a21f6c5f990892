"""The published figures: one place that holds the simulators' current headline results.

A simulator run with ``--publish FOLDER`` (the repository's ``docs/figures``) writes its
headline results there as ``<name>.json`` (the figures, the command that produced them,
and what a test needs to run one cheap case of it again) and ``<name>.md`` (the same as a
table a reader can follow). The docs link to those files instead of quoting figures, and
``tests/unit/sim/test_figures.py`` runs one case of each and checks it against the file, so
a change of a default that moves a published figure fails a test until the figure is
published again by its command.
"""
from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any, Sequence

DEFAULT_FOLDER = Path("docs/figures")


def command_line(program: str, argv: Sequence[str] | None) -> str:
    """The command a figure came from, as a reader would type it: without where its files
    went (``--out``), which says nothing of the figures."""
    return f"{program} {shlex.join(arguments(argv))}".strip()


def arguments(argv: Sequence[str] | None) -> list[str]:
    """A command's arguments as published: without ``--out`` and its folder."""
    args = list(argv if argv is not None else sys.argv[1:])
    return [a for i, a in enumerate(args)
            if not a.startswith("--out=") and a != "--out" and (i == 0 or args[i - 1] != "--out")]


def publish(folder: Path, name: str, command: str, figures: dict[str, Any], table: str) -> list[Path]:
    """Write ``<name>.json`` (``figures`` and ``command``) and ``<name>.md`` (``table``)."""
    folder.mkdir(parents=True, exist_ok=True)
    data = {"name": name, "command": command, **figures}
    paths = [folder / f"{name}.json", folder / f"{name}.md"]
    paths[0].write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    paths[1].write_text(f"# {name}\n\nProduced by:\n\n```bash\n{command}\n```\n\n{table.rstrip()}\n")
    return paths


def load(folder: Path, name: str) -> dict[str, Any]:
    return json.loads((folder / f"{name}.json").read_text())
