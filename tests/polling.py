"""Waiting on a fact of another process with a deadline: the one polling helper of the
tests, sync (``eventually``) and async (``eventually_async``).

Polling is only for what other processes do that gives nothing to await: a file a worker
writes, a topic a relay forwards to, a read model that folds a log on its own schedule,
a port that starts to listen. Where there is an event (a WatchJobs stream, an
``asyncio.Event``, a follower's ``changed``), a test awaits it instead.

Both return the predicate's first truthy value. At the deadline they raise
``AssertionError`` naming ``what`` and the timeout; exceptions of the types in
``ignoring`` count as "not yet" (the last one becomes the error's cause).
"""
from __future__ import annotations

import asyncio
import inspect
import time
from typing import Any, Awaitable, Callable


def _timed_out(what: str, timeout: float) -> AssertionError:
    return AssertionError(f"timed out after {timeout}s waiting for {what}")


def eventually(predicate: Callable[[], Any], what: str, timeout: float = 30.0, poll: float = 0.01, *,
               ignoring: tuple[type[BaseException], ...] = ()) -> Any:
    """``predicate()``'s first truthy value, asked every ``poll`` seconds."""
    deadline = time.monotonic() + timeout
    failure: BaseException | None = None
    while True:
        try:
            value = predicate()
        except ignoring as exc:
            value, failure = None, exc
        if value:
            return value
        if time.monotonic() > deadline:
            raise _timed_out(what, timeout) from failure
        time.sleep(poll)   # another process's progress: nothing to await


async def eventually_async(predicate: Callable[[], Any | Awaitable[Any]], what: str, timeout: float = 30.0,
                           poll: float = 0.01, *, ignoring: tuple[type[BaseException], ...] = ()) -> Any:
    """The same in a coroutine: ``predicate`` may be sync or async; an attempt still
    running at the deadline is cancelled."""
    failure: BaseException | None = None

    async def attempt() -> Any:
        nonlocal failure
        try:
            value = predicate()
            if inspect.isawaitable(value):
                value = await value
            return value
        except ignoring as exc:
            failure = exc
            return None

    scope = asyncio.timeout(timeout)
    try:
        async with scope:
            while not (value := await attempt()):
                await asyncio.sleep(poll)   # another process's progress: nothing to await
            return value
    except TimeoutError:
        if not scope.expired():
            raise   # the predicate's own
        raise _timed_out(what, timeout) from failure
