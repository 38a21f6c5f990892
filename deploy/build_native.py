"""Compile the reducer's modules with mypyc into gpusched/_native/ (see gpusched.native).

    .venv/bin/python deploy/build_native.py [--force]

Run by deploy/setup.sh; does nothing when the build matches the sources. Needs mypy
(the dev extra) and a C compiler with the Python headers; without them it says why and
exits 1, and gpusched runs its plain modules, unchanged.
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gpusched import native  # noqa: E402


def build() -> None:
    from mypyc.build import mypycify
    from setuptools import setup

    sources = [f"gpusched/{name}" for name in native.COMPILED]
    with tempfile.TemporaryDirectory(prefix="gpusched-native-") as tmp:
        out = Path(tmp) / "lib"
        setup(name="gpusched-native", ext_modules=mypycify(sources, opt_level="3", group_name="gpusched_native"),
              script_args=["-q", "build_ext", "--build-lib", str(out), "--build-temp", str(Path(tmp) / "tmp")])
        (out / "SOURCES").write_text(native.source_stamp() + "\n")
        # Swap the whole folder: a failed build leaves the previous one (or none), never half.
        old = native.BUILD_DIR.with_name("_native.old")
        shutil.rmtree(old, ignore_errors=True)
        if native.BUILD_DIR.exists():
            native.BUILD_DIR.rename(old)
        shutil.move(str(out), native.BUILD_DIR)
        shutil.rmtree(old, ignore_errors=True)


def main(argv: list[str]) -> int:
    os.chdir(REPO)   # mypyc names the modules after their paths from here
    if native.built_stamp() == native.source_stamp() and "--force" not in argv:
        print("build_native: up to date")
        return 0
    try:
        build()
    except (Exception, SystemExit) as exc:   # setuptools reports a failed compile as SystemExit
        print(f"build_native: not built ({exc!r}); gpusched runs its plain Python modules", file=sys.stderr)
        return 1
    print(f"build_native: compiled {', '.join(native.COMPILED)} into {native.BUILD_DIR.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
