"""The tests' polling helper: the first truthy value, or an AssertionError naming what was
awaited and the timeout."""
from __future__ import annotations

import asyncio
import itertools

import pytest

from tests.polling import eventually, eventually_async


def test_the_first_truthy_value_is_returned():
    answers = iter([None, 0, [], {"pid": 7}, {"pid": 8}])
    assert eventually(lambda: next(answers), "a pid", timeout=5, poll=0) == {"pid": 7}


def test_the_deadline_names_what_and_the_timeout():
    with pytest.raises(AssertionError, match=r"timed out after 0.05s waiting for the shim"):
        eventually(lambda: False, "the shim", timeout=0.05)


def test_ignored_errors_count_as_not_yet_and_the_last_is_the_cause():
    calls = itertools.count()

    def registered():
        if next(calls) < 3:
            raise LookupError("not yet")
        return "node-0"
    assert eventually(registered, "the node", timeout=5, poll=0, ignoring=(LookupError,)) == "node-0"
    with pytest.raises(AssertionError) as err:
        eventually(lambda: {}["node"], "the node", timeout=0.05, ignoring=(LookupError,))
    assert isinstance(err.value.__cause__, KeyError)
    with pytest.raises(ValueError):   # not ignored: at once
        eventually(lambda: int("x"), "a number", timeout=5, ignoring=(LookupError,))


async def test_async_takes_a_sync_or_an_async_predicate():
    answers = iter([None, "", "up"])
    assert await eventually_async(lambda: next(answers), "up", timeout=5, poll=0) == "up"

    async def later():
        await asyncio.sleep(0)
        return 3
    assert await eventually_async(later, "three", timeout=5) == 3


async def test_async_cancels_an_attempt_still_running_at_the_deadline():
    async def hangs():
        await asyncio.Event().wait()
    with pytest.raises(AssertionError, match=r"timed out after 0.05s waiting for a hung probe"):
        await eventually_async(hangs, "a hung probe", timeout=0.05)


async def test_async_lets_a_predicates_own_timeout_through():
    async def own():
        raise TimeoutError("the probe's own")
    with pytest.raises(TimeoutError, match="the probe's own"):
        await eventually_async(own, "a probe", timeout=5)
