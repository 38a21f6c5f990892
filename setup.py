"""The build step that adds the generated and compiled parts to a wheel (pyproject.toml
holds the metadata and names setuptools as the build backend).

Why setuptools: the packages map the services' folders onto importable names
(``services/node-agent`` -> ``gpusched_node_agent``, ``package-dir``), mypyc compiles the
reducer through setuptools' own extension machinery, and a ``build_py`` step is where
generated files join a build. This one, after copying the sources, runs
deploy/build_parts.py's steps into the build folder: grpc_tools.protoc generates the
protobuf/gRPC code and the descriptor set (required), the C compiler builds the worker
shim beside ``shim_process.py``, and mypyc compiles the reducer into
``gpusched/_native``. Where the shim or the reducer cannot be compiled (no C compiler, not
Linux) the build goes on with a warning: the reducer then runs as plain Python (the same
source), the node-agent refuses real workloads at start-up, and ``gpusched version
--verbose`` says which. A wheel is built for the platform and Python that built it: it
carries a C program and, where mypyc ran, extension modules.

An editable install (``pip install -e``, as deploy/setup.sh makes) gets none of this
here: deploy/setup.sh builds the same parts into the checkout.
"""
import sys
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

sys.path.insert(0, str(Path(__file__).resolve().parent / "deploy"))
import build_parts  # noqa: E402


class BuildPyWithParts(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        root = Path(self.build_lib)
        build_parts.generate_protos(root)
        why = build_parts.build_shim(root / "gpusched_node_agent" / build_parts.SHIM_NAME)
        if why:
            build_parts.log(f"warning: the worker shim is not built ({why}): this package's node-agent runs "
                            "simulated work only")
        why = build_parts.build_reducer(root / "gpusched")
        if why:
            build_parts.log(f"warning: the reducer is not compiled ({why}): it runs as plain Python")


class CompiledDistribution(Distribution):
    """A compiled shim and mypyc's modules: a wheel for this platform and Python."""

    def has_ext_modules(self) -> bool:
        return True


setup(cmdclass={"build_py": BuildPyWithParts}, distclass=CompiledDistribution)
