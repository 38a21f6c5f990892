"""Batches of records sent with several in flight, acknowledged in order, for a writer of
compacted topics (the work views, ``gpusched.adapters.nodes.work_writer``).

Waiting for each batch's acknowledgements before sending the next costs a round trip to
the broker per batch, on the path of every record behind it; with up to ``depth``
batches in flight the next batch goes out while the earlier ones are acknowledged.

What compaction keeps is the last record of each key, so the order in which records
land matters: a batch sent again after a newer one would leave its older record last.
So on any failure, every batch in flight is sent again, in order, once everything in
flight has settled (acknowledged or failed: nothing of an earlier send is still on its
way), and no new batch goes out until all of them are acknowledged. A record written
twice this way is harmless: readers skip or re-apply what they already have.

The producer's idempotence alone would not do: it keeps one partition's batches in
order while it retries them itself, but once it gives a batch up (its timeout) the
batches queued behind it still go out, and the writer's retry lands after them.
"""
from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

log = logging.getLogger(__name__)
Record = TypeVar("Record")
DEPTH = 4   # batches in flight


@dataclass(slots=True)
class Flight(Generic[Record]):
    records: list[Record]
    done: int                                         # what the batch completes, for ``on_acked``
    acks: list[asyncio.Future] = field(default_factory=list)


class OrderedSender(Generic[Record]):
    """``put`` sends a batch (waiting while ``depth`` are in flight); ``run`` (a task)
    awaits their acknowledgements in order and calls ``on_acked(done)`` for each batch
    acknowledged whole. ``send(record)`` queues one record and returns the future of its
    acknowledgement (``EventPublisher.send_raw_later``'s contract)."""

    def __init__(self, send: Callable[[Record], Awaitable[asyncio.Future]], on_acked: Callable[[int], None],
                 name: str, depth: int = DEPTH, first_delay: float = 0.2) -> None:
        self._send = send
        self._first_delay = first_delay   # before sending again; doubled each time, up to 5 s
        self._on_acked = on_acked
        self._name = name
        self._flights: deque[Flight[Record]] = deque()
        self._slots = asyncio.Semaphore(depth)
        self._resending = asyncio.Lock()   # held while the batches in flight are sent again
        self._sent = asyncio.Event()
        self.resends = 0

    async def put(self, records: list[Record], done: int) -> None:
        await self._slots.acquire()
        async with self._resending:
            flight = Flight(records, done)
            flight.acks = [await self._send_one(r) for r in records]
            self._flights.append(flight)
            self._sent.set()

    async def run(self) -> None:
        while True:
            while not self._flights:
                self._sent.clear()
                await self._sent.wait()
            head = self._flights[0]
            try:
                await asyncio.gather(*head.acks)
            except asyncio.CancelledError:
                raise
            except Exception:   # which one, and why: _resend_all logs it
                async with self._resending:
                    await self._resend_all()
            self._flights.popleft()
            self._slots.release()
            self._on_acked(head.done)

    async def _resend_all(self) -> None:
        """Send every batch in flight again, in order, until all are acknowledged."""
        flights = list(self._flights)
        delay = self._first_delay
        while True:
            pending = [ack for f in flights for ack in f.acks]
            if pending:
                await asyncio.wait(pending)   # settled: no earlier send lands after the resend
            failed = [a for a in pending if a.cancelled() or a.exception() is not None]
            if not failed:
                return
            why = "cancelled" if failed[0].cancelled() else failed[0].exception()
            log.warning("%s: %d of %d records in flight failed (%r); sending %d batches again in %.1fs",
                        self._name, len(failed), len(pending), why, len(flights), delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)
            self.resends += 1
            for flight in flights:
                flight.acks = [await self._send_one(r) for r in flight.records]

    async def _send_one(self, record: Record) -> asyncio.Future:
        """The record's acknowledgement; a send refused at once (no metadata in time, a
        full buffer) is a failed acknowledgement, handled as one."""
        try:
            return await self._send(record)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            failed = asyncio.get_running_loop().create_future()
            failed.set_exception(exc)
            return failed
