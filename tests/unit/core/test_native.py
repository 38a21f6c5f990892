"""The reducer compiled with mypyc (gpusched.native): in use where built, and the same
fold as the plain modules, outcome for outcome."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpusched import native

REPO = Path(__file__).resolve().parents[3]
COMPILED = "compiled (mypyc)"
NATIVE_OFF = os.environ.get("GPUSCHED_NATIVE") == "0"

# A pool log with every kind of event the services write (placements, some stale,
# starts, checkpoints, successes, failures with retries, cancellations, GPU faults, node
# loss and return, retention), then the same log folded again from empty, outcome by
# outcome.
FOLD = """
import hashlib, sys
sys.path.insert(0, "bench")
from pool_workload import PoolSim
from gpusched import native
from gpusched.core.digest import digest
from gpusched.core.reducer import apply
from gpusched.core.state import ClusterState
sim = PoolSim(seed=11, nodes=150, retention_s=120.0)
sim.run(30_000, backlog=600)
state, outcomes = ClusterState(), hashlib.sha256()
for event in sim.events:
    o = apply(state, event)
    outcomes.update(repr((o.accepted, o.reason, o.jobs, o.duplicate)).encode())
print(native.status)
print(len(sim.events), sim.accepted, state.rejected, state.pruned)
print(digest(sim.state), digest(state), outcomes.hexdigest())
"""


def fold_in_child(native_on: bool) -> list[str]:
    env = {**os.environ, "GPUSCHED_NATIVE": "1" if native_on else "0"}
    out = subprocess.run([sys.executable, "-c", FOLD], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


@pytest.mark.skipif(NATIVE_OFF, reason="GPUSCHED_NATIVE=0 asks for the plain modules")
def test_setup_built_the_compiled_reducer_and_it_is_in_use() -> None:
    import gpusched.core.reducer as reducer
    import gpusched.core.state as state

    assert native.status == COMPILED, native.status
    assert reducer.__file__.endswith(".so") and state.__file__.endswith(".so")
    # Compiled classes expose fields as getset descriptors; JobState stays a plain
    # slotted class (member descriptors), as the interpreted policies read it.
    assert type(vars(state.NodeState)["used_cpu"]).__name__ == "getset_descriptor"
    assert type(vars(state.JobState)["phase"]).__name__ == "member_descriptor"


@pytest.mark.skipif(NATIVE_OFF, reason="GPUSCHED_NATIVE=0 asks for the plain modules")
def test_compiled_and_plain_reducers_fold_the_same_log_outcome_for_outcome() -> None:
    compiled, plain = fold_in_child(True), fold_in_child(False)
    assert compiled[0] == COMPILED and plain[0].startswith("pure Python")
    events, accepted, rejected, pruned = map(int, plain[1].split())
    assert events >= 30_000 and rejected > 0 and pruned > 0   # the log exercises rejections and retention
    assert compiled[1:] == plain[1:]
    generated, refolded, _ = plain[2].split()
    assert generated == refolded


@pytest.mark.parametrize("env, stamp, expect", [
    ("0", "matching", "pure Python: GPUSCHED_NATIVE=0"),
    ("1", None, "pure Python: not compiled"),
    ("1", "stale", "pure Python: the build is for other sources"),
    ("1", "matching", COMPILED),
])
def test_core_path_uses_a_build_only_for_these_sources(tmp_path, monkeypatch, env, stamp, expect) -> None:
    monkeypatch.setenv("GPUSCHED_NATIVE", env)
    monkeypatch.setattr(native, "BUILD_DIR", tmp_path)
    monkeypatch.setattr(native, "STAMP", tmp_path / "SOURCES")
    monkeypatch.setattr(native, "status", native.status)
    monkeypatch.setattr(sys, "path", list(sys.path))
    if stamp is not None:
        (tmp_path / "SOURCES").write_text(native.source_stamp() if stamp == "matching" else "0" * 64)
    path = native.core_path(["/src/gpusched/core"])
    assert native.status.startswith(expect)
    if expect == COMPILED:
        assert path == [str(tmp_path / "gpusched" / "core"), "/src/gpusched/core"] and str(tmp_path) in sys.path
    else:
        assert path == ["/src/gpusched/core"]


def test_field_hints_of_compiled_classes_name_their_element_types() -> None:
    from gpusched.core.state import ClusterState, JobState, NodeState

    hints = native.field_hints(ClusterState)
    assert hints["nodes"] == dict[str, NodeState] and hints["jobs"] == dict[str, JobState]
    assert native.field_hints(NodeState)["jobs"] == set[str]
