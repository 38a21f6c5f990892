"""The snapshot codec is pure; the adapters run it with the cyclic GC paused, freeze a
restored state for services only, and may capture on one thread while encoding on another."""
from __future__ import annotations

import ast
import gc
import threading
from pathlib import Path

import pytest

from gpusched.adapters.log import restore, snapshots
from gpusched.adapters.log.restore import decode_state
from gpusched.adapters.log.snapshots import capture_state, encode_state
from gpusched.core import snapshot as codec
from gpusched.core.digest import digest
from gpusched.core.snapshot import snapshot_bytes
from tests.unit.core.builders import _sample_state


@pytest.fixture
def gc_on():
    was = gc.isenabled()
    gc.enable()
    yield
    gc.unfreeze()
    if not was:
        gc.disable()


def test_the_core_codec_leaves_the_gc_and_threads_to_its_callers():
    tree = ast.parse((Path(__file__).resolve().parents[3] / "gpusched" / "core" / "snapshot.py").read_text())
    names = {a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names}
    assert not {"gc", "threading"} & names


def test_capture_and_encode_run_with_the_gc_paused_and_give_it_back(monkeypatch, gc_on):
    seen = []
    real_capture, real_encode = snapshots.capture, snapshots.encode_captured
    monkeypatch.setattr(snapshots, "capture", lambda s: (seen.append(gc.isenabled()), real_capture(s))[1])
    monkeypatch.setattr(snapshots, "encode_captured", lambda c: (seen.append(gc.isenabled()), real_encode(c))[1])
    state = _sample_state()
    assert encode_state(capture_state(state)) == snapshot_bytes(state)
    assert seen == [False, False] and gc.isenabled()


def test_decode_runs_with_the_gc_paused_and_freezes_only_when_asked(monkeypatch, gc_on):
    data = snapshot_bytes(_sample_state())
    seen = []
    real = restore.state_from_snapshot
    monkeypatch.setattr(restore, "state_from_snapshot", lambda d: (seen.append(gc.isenabled()), real(d))[1])
    gc.unfreeze()
    plain = decode_state(data)
    assert gc.get_freeze_count() == 0 and seen == [False] and gc.isenabled()
    frozen = decode_state(data, freeze=True)
    assert gc.get_freeze_count() > 0 and digest(frozen) == digest(plain)


def test_capture_and_encode_may_run_on_two_threads_at_once():
    states = [_sample_state() for _ in range(4)]
    expected = [snapshot_bytes(s) for s in states]
    results: dict[int, bytes] = {}

    def encode(i: int) -> None:
        results[i] = codec.encode_captured(codec.capture(states[i]))

    threads = [threading.Thread(target=encode, args=(i,)) for i in range(len(states))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [results[i] for i in range(len(states))] == expected
