"""The published figures: one place that holds the simulators' current headline results.

A simulator run with ``--publish FOLDER`` (the repository's ``docs/figures``) writes its
headline results there as ``<name>.json`` (the figures, the command that produced them,
and what a test needs to run one cheap case of it again) and ``<name>.md`` (the same as a
table a reader can follow), and rewrites the folder's ``README.md``, the index of every
result it holds (``python -m gpusched.sim.figures [FOLDER]`` rewrites the index alone). The
docs link to those files instead of quoting figures, and ``tests/unit/sim/test_figures.py``
runs one case of each and checks it against the file, so a change of a default that moves a
published figure fails a test until the figure is published again by its command.
"""
from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any, Sequence

DEFAULT_FOLDER = Path("docs/figures")
INDEX = "README.md"
INDEX_HEAD = """# Results

The current figures of gpusched's simulators, each file written by the command it names
(`--publish docs/figures`); nothing here is edited by hand. `<name>.md` is the table to
read, `<name>.json` every figure and the command's arguments, from which
`tests/unit/sim/test_figures.py` runs one case of each again at HEAD: a change that moves a
published figure fails that test until the command publishes it again. How each simulator
works and how to read its figures: docs/design/scheduling-placement.md (static packing),
docs/design/scheduling-fairness.md (the dynamic simulator, the preemptor's ratio search and
the borrow-and-reclaim runs), docs/design/benchmarks.md (every benchmark).
"""


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
    paths[1].write_text(page(name, command, table))
    write_index(folder)
    return paths


def page(name: str, command: str, table: str) -> str:
    """``<name>.md``: the command, then the table."""
    return f"# {name}\n\nProduced by:\n\n```bash\n{command}\n```\n\n{table.rstrip()}\n"


def index(folder: Path) -> str:
    """The folder's index: every published result, with the command that produced it."""
    rows = []
    for path in sorted(folder.glob("*.json")):
        data = json.loads(path.read_text())
        rows.append(f"| [{data['name']}]({path.stem}.md) | `{data['command']}` |")
    return INDEX_HEAD + "\n| result | produced by |\n| --- | --- |\n" + "\n".join(rows) + "\n"


def write_index(folder: Path) -> Path:
    path = folder / INDEX
    path.write_text(index(folder))
    return path


def load(folder: Path, name: str) -> dict[str, Any]:
    return json.loads((folder / f"{name}.json").read_text())


if __name__ == "__main__":
    print(write_index(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_FOLDER))
