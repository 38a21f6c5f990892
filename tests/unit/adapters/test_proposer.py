"""``PartitionProposer``'s pacing: with ``busy_share`` a decider whose rounds are slow keeps
at most that share of the time, however often the log moves; by default rounds follow
the log back to back."""
from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from gpusched.adapters.log.proposer import PartitionProposer


class _MovingLog:
    """A follower whose log moves all the time (a burst): ``changed`` is always set."""

    def __init__(self) -> None:
        self.states = {0: SimpleNamespace(offset=10)}
        self._changed = asyncio.Event()

    @property
    def changed(self) -> asyncio.Event:   # set again at every look: the log moved meanwhile
        self._changed.set()
        return self._changed


async def _share_of_time_deciding(busy_share: float, run_s: float = 0.6, round_s: float = 0.02) -> float:
    busy = 0.0

    def decide(partition, state, now):
        nonlocal busy
        started = time.monotonic()
        while time.monotonic() - started < round_s:   # a round that costs CPU, as a scan of the pool
            pass
        busy += time.monotonic() - started
        return []

    proposer = PartitionProposer(_MovingLog(), publisher=None, decide=decide, name="p", busy_share=busy_share)
    proposer.ready_at[0] = 0
    stop = asyncio.Event()
    began = time.monotonic()
    task = asyncio.create_task(proposer.run(stop))
    await asyncio.sleep(run_s)
    stop.set()
    await asyncio.wait_for(task, 5)
    return busy / (time.monotonic() - began)


async def test_a_paced_decider_keeps_its_share_of_the_time():
    assert await _share_of_time_deciding(0.25) <= 0.35


async def test_an_unpaced_decider_follows_the_log_back_to_back():
    assert await _share_of_time_deciding(1.0) >= 0.6


def test_a_share_outside_zero_to_one_is_refused():
    with pytest.raises(ValueError, match="busy_share"):
        PartitionProposer(_MovingLog(), None, lambda *a: [], "p", busy_share=0)
