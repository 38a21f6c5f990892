"""The package's generated and compiled parts, made from its sources:

* ``protos``: the protobuf/gRPC Python code of ``proto/gpusched/v1/*.proto`` and its
  descriptor set ``gpusched.desc`` (for ``gpusched decode`` and ``protoc --decode``),
  with grpc_tools.protoc. Required: nothing of gpusched imports without it.
* ``shim``: the worker shim ``gpusched-shim`` from ``services/node-agent/shim.c``, with
  the C compiler (``$CC``, else ``cc``). Without it the node-agent runs simulated work
  only and refuses real workloads at start-up, saying why.
* ``reducer``: the reducer's modules (``gpusched.native.COMPILED``) compiled with mypyc
  into ``gpusched/_native/``, beside a stamp of the sources (``gpusched.native``). Needs
  mypy, a C compiler and the Python headers; without them the same modules run as plain
  Python.

    python deploy/build_parts.py [--force] [protos] [shim] [reducer]

builds them into this checkout (``deploy/setup.sh`` runs it; each part is skipped when it
is newer than its sources, the reducer when its stamp matches); exit code 1 when the
protobuf code cannot be generated, 3 when the shim or the reducer cannot be compiled. ``setup.py`` builds the
same parts into a wheel's build folder through ``generate_protos``, ``build_shim`` and
``build_reducer``. Standard library only at import: the build environment has
grpcio-tools and mypy, a checkout's .venv too.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROTO_DIR = ROOT / "proto"
SHIM_SOURCE = ROOT / "services" / "node-agent" / "shim.c"
SHIM_NAME = "gpusched-shim"
NOT_COMPILED = 3   # exit code: the shim or the reducer could not be compiled (the rest is built)
DESCRIPTOR_SET = "gpusched.desc"


def log(message: str) -> None:
    print(f"build_parts: {message}", file=sys.stderr, flush=True)


def protos() -> list[Path]:
    return sorted((PROTO_DIR / "gpusched" / "v1").glob("*.proto"))


def generate_protos(root: Path) -> None:
    """The Python code of every .proto under ``root`` (as ``root/gpusched/v1/*_pb2*.py``)
    and its descriptor set; CalledProcessError when protoc fails."""
    out = root / "gpusched" / "v1"
    out.mkdir(parents=True, exist_ok=True)
    for old in [*out.glob("*_pb2.py"), *out.glob("*_pb2.pyi"), *out.glob("*_pb2_grpc.py")]:
        old.unlink()
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTO_DIR}", f"--python_out={root}",
                    f"--pyi_out={root}", f"--grpc_python_out={root}", f"--descriptor_set_out={out / DESCRIPTOR_SET}",
                    "--include_imports", *map(str, protos())], check=True)


def build_shim(binary: Path) -> str | None:
    """Compile the worker shim into ``binary``; why it could not be, else None."""
    compiler = os.environ.get("CC", "cc")
    if shutil.which(compiler) is None:
        return f"no C compiler ({compiler})"
    binary.parent.mkdir(parents=True, exist_ok=True)
    tmp = binary.with_name(binary.name + ".tmp")
    done = subprocess.run([compiler, "-O2", "-Wall", "-o", str(tmp), str(SHIM_SOURCE), "-lm"],
                          capture_output=True, text=True)
    if done.returncode != 0:
        tmp.unlink(missing_ok=True)
        return f"{compiler} failed: {done.stderr.strip()[-500:]}"
    tmp.chmod(0o755)
    tmp.replace(binary)
    return None


def build_reducer(package: Path) -> str | None:
    """Compile the reducer's modules into ``package/_native`` (``package``: a ``gpusched``
    folder whose ``core`` holds the same sources as this checkout's); why it could not
    be, else None. mypyc runs in a process of its own (it drives setuptools itself)."""
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--reducer-into", str(package / "_native")],
                          cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        return (done.stderr.strip() or done.stdout.strip())[-800:]
    return None


def _compile_reducer(target: Path) -> None:
    """What ``build_reducer`` runs (in this checkout's root: mypyc names the modules after
    their paths): the compiled modules and the stamp, swapped into ``target`` whole."""
    sys.path.insert(0, str(ROOT))
    from gpusched import native
    from mypyc.build import mypycify
    from setuptools import setup

    sources = [f"gpusched/{name}" for name in native.COMPILED]
    with tempfile.TemporaryDirectory(prefix="gpusched-native-") as tmp:
        out = Path(tmp) / "lib"
        setup(name="gpusched-native", ext_modules=mypycify(sources, opt_level="3", group_name="gpusched_native"),
              script_args=["-q", "build_ext", "--build-lib", str(out), "--build-temp", str(Path(tmp) / "tmp")])
        (out / "SOURCES").write_text(native.source_stamp() + "\n")
        # Swap the whole folder: a failed build leaves the previous one (or none), never half.
        old = target.with_name(target.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        if target.exists():
            target.rename(old)
        shutil.move(str(out), target)
        shutil.rmtree(old, ignore_errors=True)


# --- in this checkout (deploy/setup.sh) --------------------------------------------------
def protos_current() -> bool:
    out = ROOT / "gpusched" / "v1"
    made = [*out.glob("*_pb2.py"), out / DESCRIPTOR_SET]
    if len(made) != len(protos()) + 1 or not all(p.exists() for p in made):
        return False
    oldest = min(p.stat().st_mtime for p in made)
    return all(p.stat().st_mtime <= oldest for p in protos())


def reducer_current() -> bool:
    sys.path.insert(0, str(ROOT))
    from gpusched import native
    return native.built_stamp() == native.source_stamp()


def main(argv: list[str]) -> int:
    if argv[:1] == ["--reducer-into"]:
        _compile_reducer(Path(argv[1]))
        return 0
    force = "--force" in argv
    parts = [a for a in argv if a != "--force"] or ["protos", "shim", "reducer"]
    unknown = set(parts) - {"protos", "shim", "reducer"}
    if unknown:
        print(__doc__, file=sys.stderr)
        return 2
    failed = False
    if "protos" in parts:
        if force or not protos_current():
            log(f"generating the Python code and the descriptor set of {len(protos())} .proto files")
            try:
                generate_protos(ROOT)
            except subprocess.CalledProcessError as exc:
                log(f"error: protoc failed ({exc})")
                return 1
    if "shim" in parts:
        binary = ROOT / "services" / "node-agent" / SHIM_NAME
        if force or not binary.exists() or binary.stat().st_mtime < SHIM_SOURCE.stat().st_mtime:
            why = build_shim(binary)
            if why:
                failed = True
                log(f"the worker shim is not built ({why}): node-agents run simulated work only")
            else:
                log(f"compiled the worker shim into {binary.relative_to(ROOT)}")
    if "reducer" in parts:
        if force or not reducer_current():
            why = build_reducer(ROOT / "gpusched")
            if why:
                failed = True
                log(f"the reducer runs as plain Python (not compiled: {why})")
            else:
                log("compiled the reducer with mypyc into gpusched/_native")
    return NOT_COMPILED if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
