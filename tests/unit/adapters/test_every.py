"""``every``: the shared loop of the node-agent's and the node host's heartbeats."""
from __future__ import annotations

import asyncio

from gpusched.adapters.service import every


async def test_it_acts_at_once_then_once_an_interval_until_stopped():
    loop, stop, times = asyncio.get_running_loop(), asyncio.Event(), []

    async def act() -> None:
        times.append(loop.time())
        if len(times) == 3:
            stop.set()
    started = loop.time()
    await asyncio.wait_for(every(0.05, stop, act), 5)
    assert len(times) == 3 and times[0] - started < 0.05
    assert all(b - a >= 0.045 for a, b in zip(times, times[1:]))


async def test_a_stop_ends_the_wait_at_once_and_nothing_runs_after_it():
    stop, acted = asyncio.Event(), asyncio.Event()
    calls = []

    async def act() -> None:
        calls.append(1)
        acted.set()
    task = asyncio.create_task(every(60, stop, act))
    await acted.wait()
    stop.set()
    await asyncio.wait_for(task, 1)   # not the 60 s interval
    assert calls == [1]
