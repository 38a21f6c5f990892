"""The package as users build and install it: a clean copy of the checkout, the sdist and
wheel built from it, virtual environments with the wheel (fixtures: conftest.py)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BUILD_TIMEOUT_S = 900
INSTALL_TIMEOUT_S = 900


@dataclass(frozen=True)
class BuiltPackage:
    sdist: Path
    wheel: Path


@dataclass(frozen=True)
class Venv:
    root: Path

    def bin(self, name: str) -> str:
        return str(self.root / "bin" / name)

    @property
    def python(self) -> str:
        return self.bin("python")

    def run(self, *args: str, timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
        """A command of the environment (``args[0]``: one of its bin/ names), run outside
        the checkout, with nothing of the checkout on its path."""
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env.update(kwargs.pop("env", {}))
        kwargs.setdefault("cwd", self.root)
        return subprocess.run([self.bin(args[0]), *args[1:]], capture_output=True, text=True, timeout=timeout,
                              env=env, **kwargs)

    def distributions(self) -> set[str]:
        """The names (lower case) of every distribution installed in it."""
        listed = self.run("python", "-m", "pip", "list", "--format=freeze", "--disable-pip-version-check")
        assert listed.returncode == 0, listed.stderr
        return {line.split("==")[0].lower() for line in listed.stdout.splitlines() if "==" in line}


def clean_copy(target: Path) -> Path:
    """The files git tracks or would track (not ignored) of this checkout, copied to
    ``target``: what a fresh clone holds, with this checkout's uncommitted changes."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = REPO / name
        if not source.is_file():   # deleted and not yet committed
            continue
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target / name)
    return target


def build(source: Path, dist: Path) -> BuiltPackage:
    """``python -m build``: the sdist, then the wheel from it, in an isolated build
    environment (what ``pip wheel`` does too)."""
    done = subprocess.run([sys.executable, "-m", "build", "--outdir", str(dist), str(source)], capture_output=True,
                          text=True, timeout=BUILD_TIMEOUT_S)
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    (sdist,), (wheel,) = dist.glob("*.tar.gz"), dist.glob("*.whl")
    return BuiltPackage(sdist, wheel)


def make_venv(root: Path, wheel: Path, extras: str = "") -> Venv:
    """A new virtual environment at ``root`` with the wheel (and ``extras``) installed."""
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True, timeout=120)
    venv = Venv(root)
    requirement = f"gpusched[{extras}] @ {wheel.as_uri()}" if extras else str(wheel)
    done = venv.run("python", "-m", "pip", "install", "-q", "--disable-pip-version-check", requirement,
                    timeout=INSTALL_TIMEOUT_S)
    assert done.returncode == 0, done.stdout + done.stderr
    return venv


def wheel_members(wheel: Path) -> dict[str, int]:
    """Path in the wheel -> its Unix mode."""
    with zipfile.ZipFile(wheel) as z:
        return {info.filename: info.external_attr >> 16 for info in z.infolist()}
