"""Snapshots encoded by a forked child: the same bytes as on the loop, a clear error when
the child fails, and the parent's state untouched."""
from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from gpusched.adapters.log.forked_snapshot import CAN_FORK, snapshot_bytes_forked
from gpusched.core.digest import digest
from gpusched.core.snapshot import SnapshotError, snapshot_bytes, state_from_snapshot
from tests.unit.core.builders import _sample_state

pytestmark = pytest.mark.skipif(not CAN_FORK, reason="no os.fork on this platform")


async def test_the_child_writes_the_same_bytes_as_the_loop_would():
    state = _sample_state()
    before = digest(state)
    data, blocked_s = await snapshot_bytes_forked(state)
    assert data == snapshot_bytes(state)
    assert digest(state_from_snapshot(data)) == before == digest(state)
    assert 0 <= blocked_s < 5


def _children() -> set[int]:
    """Our child processes, zombies included (Linux /proc)."""
    me, found = os.getpid(), set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me:
            found.add(int(stat.parent.name))
    return found


async def test_a_failing_child_is_a_snapshot_error_and_leaves_no_child():
    before = _children()
    with pytest.raises(SnapshotError, match="exit status 1"):
        await snapshot_bytes_forked(object())          # not a state: the encoder raises
    assert _children() <= before                       # reaped, not left a zombie


async def test_a_big_snapshot_comes_through_the_pipe_whole():
    state = _sample_state()
    for _ in range(20_000):
        state.dedupe.add(uuid.uuid4().hex)
    data, _ = await snapshot_bytes_forked(state)
    assert len(data) > 4 * 65536                       # several pipe buffers
    assert data == snapshot_bytes(state)
