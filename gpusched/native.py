"""The reducer's modules compiled with mypyc, used when built for exactly these sources.

The package build (setup.py), or ``deploy/build_parts.py`` in a checkout (run by
``deploy/setup.sh``), compiles ``COMPILED`` into ``gpusched/_native/``, beside a stamp of
the sources it compiled. ``gpusched.core`` then
imports those modules from there instead of the ``.py`` files: the same code,
faster to replay a log (docs/design/design.md: "Package choices"; docs/design/benchmarks.md:
"Recovery"). The build lives outside the source folders so that a stale build can
never shadow edited sources: when the stamp does not match the sources (or the
interpreter), or ``GPUSCHED_NATIVE=0``, the plain modules are used, which are always
complete and always correct.
"""
from __future__ import annotations

import ast
import hashlib
import os
import sys
import typing
from functools import cache
from pathlib import Path
from typing import Any

PACKAGE = Path(__file__).resolve().parent
BUILD_DIR = PACKAGE / "_native"
STAMP = BUILD_DIR / "SOURCES"
# The reducer and the state it folds into. JobState stays a plain Python class (see
# state.py): the interpreted policies read it in tight loops.
COMPILED = ("core/mig.py", "core/state.py", "core/capacity.py", "core/retention.py", "core/validation.py",
            "core/reducer.py")

status = "pure Python: gpusched.core not imported yet"


def source_stamp() -> str:
    """What a build is valid for: the interpreter and every source of ``gpusched.core``,
    byte for byte; the modules it did not compile too, since the compiled code relies on
    the types it saw in them (an ``int`` field is read unboxed)."""
    digest = hashlib.sha256(sys.implementation.cache_tag.encode())
    for path in sorted((PACKAGE / "core").glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def built_stamp() -> str | None:
    """The stamp of the build in ``BUILD_DIR``, or None when there is none."""
    try:
        return STAMP.read_text().strip()
    except OSError:
        return None


def core_path(path: list[str]) -> list[str]:
    """``gpusched.core.__path__``, with the compiled modules' folder first when they were
    built for these sources; sets ``status`` either way."""
    global status
    # Read here, not through gpusched.config: this runs when gpusched.core is first
    # imported, before anything else, and the core's processes (the catch-up reader, the
    # simulator) need no pydantic. ProcessSettings declares and validates the variable.
    if os.environ.get("GPUSCHED_NATIVE", "1") == "0":
        status = "pure Python: GPUSCHED_NATIVE=0"
        return path
    built = built_stamp()
    if built is None:
        status = "pure Python: not compiled (no C compiler where it was built; deploy/setup.sh builds it in a checkout)"
        return path
    if built != source_stamp():
        status = "pure Python: the build is for other sources (deploy/setup.sh rebuilds it)"
        return path
    if str(BUILD_DIR) not in sys.path:
        sys.path.append(str(BUILD_DIR))   # mypyc's shared library is a top-level module
    status = "compiled (mypyc)"
    return [str(BUILD_DIR / "gpusched" / "core"), *path]


def is_compiled(cls: type) -> bool:
    module = sys.modules.get(cls.__module__)
    return str(getattr(module, "__file__", "")).endswith((".so", ".pyd"))


@cache
def field_hints(cls: type) -> dict[str, Any]:
    """``typing.get_type_hints(cls)``, also for a dataclass compiled by mypyc, which keeps
    only erased field types (``dict`` for ``dict[str, NodeState]``): those are read from
    the class's source and evaluated in its compiled module, so they name its classes."""
    if not is_compiled(cls):
        return typing.get_type_hints(cls)
    module = sys.modules[cls.__module__]
    source = PACKAGE.joinpath(*cls.__module__.split(".")[1:]).with_suffix(".py")
    for node in ast.parse(source.read_text()).body:
        if isinstance(node, ast.ClassDef) and node.name == cls.__name__:
            return {item.target.id: eval(ast.unparse(item.annotation), vars(module))  # noqa: S307 - our own source
                    for item in node.body
                    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)}
    raise TypeError(f"no class {cls.__name__} in {source}")
