"""GcPacer: freezes what survives a full collection, collects garbage first, thaws on
schedule. Run against the real collector, on a real event loop."""
from __future__ import annotations

import asyncio
import gc
import weakref

import pytest

from gpusched.adapters.log.gc_pacing import GcPacer


class Node:
    def __init__(self) -> None:
        self.other = None


@pytest.fixture
def clean_gc():
    gc.collect()
    gc.unfreeze()
    yield
    gc.unfreeze()


async def _settle() -> None:
    for _ in range(3):   # call_soon_threadsafe callbacks run on the next loop turns
        await asyncio.sleep(0)


async def test_a_full_collection_freezes_the_survivors(clean_gc):
    pacer = GcPacer(asyncio.get_running_loop()).install()
    try:
        keep = [Node() for _ in range(1000)]
        gc.collect(1)                     # a young collection: nothing frozen
        await _settle()
        assert pacer.freezes == 0 and gc.get_freeze_count() == 0
        gc.collect()                      # full
        await _settle()
        assert pacer.freezes == 1
        assert gc.get_freeze_count() >= len(keep)
        assert not any(gc.is_tracked(k) and k in gc.get_objects(2) for k in keep[:3])
    finally:
        pacer.uninstall()


async def test_garbage_cycles_are_collected_not_frozen(clean_gc):
    pacer = GcPacer(asyncio.get_running_loop()).install()
    try:
        a, b = Node(), Node()
        a.other, b.other = b, a
        gone = weakref.ref(a)
        del a, b
        gc.collect()
        await _settle()
        assert pacer.freezes == 1
        assert gone() is None
    finally:
        pacer.uninstall()


async def test_frozen_objects_are_still_freed_by_reference_count(clean_gc):
    pacer = GcPacer(asyncio.get_running_loop()).install()
    try:
        obj = Node()
        gone = weakref.ref(obj)
        gc.collect()
        await _settle()
        assert gc.get_freeze_count() > 0
        del obj
        assert gone() is None
    finally:
        pacer.uninstall()


async def test_it_thaws_once_the_period_is_over(clean_gc):
    now = [0.0]
    pacer = GcPacer(asyncio.get_running_loop(), thaw_every_s=60, clock=lambda: now[0]).install()
    try:
        gc.collect()
        await _settle()
        assert (pacer.freezes, pacer.thaws) == (1, 0) and gc.get_freeze_count() > 0
        now[0] = 61
        gc.collect()
        await _settle()
        assert pacer.thaws == 1 and gc.get_freeze_count() == 0
        gc.collect()                      # the rescan after a thaw freezes again
        await _settle()
        assert pacer.freezes == 2 and gc.get_freeze_count() > 0
    finally:
        pacer.uninstall()


async def test_uninstall_stops_it(clean_gc):
    pacer = GcPacer(asyncio.get_running_loop()).install()
    pacer.uninstall()
    gc.collect()
    await _settle()
    assert pacer.freezes == 0 and gc.get_freeze_count() == 0
