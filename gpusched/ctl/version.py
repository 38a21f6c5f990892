"""``gpusched version [--verbose]``: the package's version and the log schema it writes;
verbose, also what this installation runs: where it is installed, the protobuf and gRPC
runtimes, the reducer (compiled or plain Python), the worker shim, and which of the
package's extras are installed. Reads the installation only (no module of an extra is
imported)."""
from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import sys
from pathlib import Path

import click

from gpusched.version import LOG_SCHEMA, VERSION

SHIM_NAME = "gpusched-shim"   # beside gpusched_node_agent's modules (services/node-agent/shim_process.py)


def _distribution_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def reducer() -> str:
    """How ``gpusched.core`` runs its reducer here (gpusched.native decides on import)."""
    import gpusched.core  # noqa: F401  (importing it decides; it imports only gpusched.native)
    from gpusched import native
    return native.status


def worker_shim() -> str:
    spec = importlib.util.find_spec("gpusched_node_agent")   # found, not imported
    if spec is None or not spec.submodule_search_locations:
        return "no node-agent package"
    binary = Path(list(spec.submodule_search_locations)[0]) / SHIM_NAME
    if os.access(binary, os.X_OK):
        return str(binary)
    return f"not built ({binary} is missing): the node-agent runs simulated work only"


def extras() -> list[str]:
    """One line per extra of the package: installed, or what of it is missing."""
    try:
        meta = importlib.metadata.metadata("gpusched")
        requires = importlib.metadata.requires("gpusched") or []
    except importlib.metadata.PackageNotFoundError:
        return ["extras: unknown (the package's metadata is not installed)"]
    needs: dict[str, list[str]] = {name: [] for name in meta.get_all("Provides-Extra") or []}
    for requirement in requires:
        extra = re.search(r"""extra\s*==\s*["']([^"']+)["']""", requirement)
        name = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
        if extra and name and name.group(0).lower() != "gpusched":
            needs.setdefault(extra.group(1), []).append(name.group(0))
    lines = []
    for extra, names in needs.items():
        missing = [n for n in names if _distribution_version(n) == "not installed"]
        lines.append(f"extra [{extra}]: " + (f"not installed (missing {', '.join(missing)})" if missing
                                             else "installed"))
    return lines


def details() -> list[str]:
    import gpusched
    return [f"log schema: writes {LOG_SCHEMA}, reads 1 to {LOG_SCHEMA}",
            f"python: {sys.version.split()[0]} ({sys.executable})",
            f"installed in: {Path(gpusched.__file__).resolve().parent}",
            f"protobuf {_distribution_version('protobuf')}, grpcio {_distribution_version('grpcio')}",
            f"reducer: {reducer()}",
            f"worker shim: {worker_shim()}",
            *extras()]


@click.command()
@click.option("--verbose", "-v", is_flag=True,
              help="also where it is installed, its reducer, its worker shim and its extras")
def version(verbose: bool) -> None:
    """The package's version and the log schema it writes (docs/guide/deploying.md)."""
    click.echo(f"gpusched {VERSION}")
    if verbose:
        for line in details():
            click.echo(line)
