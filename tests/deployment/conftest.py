"""Fixtures of the deployment tests: the package built once per session, and installed.

* ``built_package`` (session): the sdist and the wheel, built with ``python -m build``
  (isolated, the wheel from the sdist) from a clean copy of this checkout: the files git
  tracks, or would (not ignored), and nothing generated.
* ``base_venv``, ``agent_venv``, ``server_venv``, ``tools_venv`` (session): fresh virtual
  environments outside the checkout with the wheel alone, with ``[agent]`` (a GPU node),
  with ``[server]`` (the control plane) and with ``[accounting,dashboard,sim]``: one per
  role whose import boundary a test proves, since what is installed is what the role pulls.
"""
from __future__ import annotations

import pytest

from tests.deployment.installs import BuiltPackage, Venv, build, clean_copy, make_venv


@pytest.fixture(scope="session")
def built_package(tmp_path_factory: pytest.TempPathFactory) -> BuiltPackage:
    root = tmp_path_factory.mktemp("package")
    return build(clean_copy(root / "source"), root / "dist")


@pytest.fixture(scope="session")
def base_venv(built_package: BuiltPackage, tmp_path_factory: pytest.TempPathFactory) -> Venv:
    return make_venv(tmp_path_factory.mktemp("venv") / "base", built_package.wheel)


@pytest.fixture(scope="session")
def agent_venv(built_package: BuiltPackage, tmp_path_factory: pytest.TempPathFactory) -> Venv:
    return make_venv(tmp_path_factory.mktemp("venv") / "agent", built_package.wheel, "agent")


@pytest.fixture(scope="session")
def server_venv(built_package: BuiltPackage, tmp_path_factory: pytest.TempPathFactory) -> Venv:
    return make_venv(tmp_path_factory.mktemp("venv") / "server", built_package.wheel, "server")


@pytest.fixture(scope="session")
def tools_venv(built_package: BuiltPackage, tmp_path_factory: pytest.TempPathFactory) -> Venv:
    return make_venv(tmp_path_factory.mktemp("venv") / "tools", built_package.wheel, "accounting,dashboard,sim")
