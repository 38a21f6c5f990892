"""Tentative bookings made during one scheduling cycle.

A cycle places many jobs; each must see the ones placed before it. Rather than copying
the state, the cycle books its decisions into the live state (the same ``commit`` the
reducer uses) and releases them all when the cycle ends, leaving the state exactly as
the log made it. This is Kubernetes' assume/forget, bounded by one synchronous call.

A booking also carries the *views* placement policies build over the nodes for the
length of the cycle (free-capacity indexes, numpy mirrors): built once, then kept up to
date by the booking itself, which tells them about every node it books or releases.
Code that changes node allocations behind the booking's back (a reservation hold) calls
``note`` with the nodes it touched.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterable, Iterator, Protocol

from gpusched.core.capacity import commit, release
from gpusched.core.model import WorkerAssignment
from gpusched.core.state import ClusterState, JobState


class NodeView(Protocol):
    def touch(self, names: Iterable[str]) -> None:
        """These nodes' allocations changed: refresh what is derived from them."""


class Booking:
    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self._held: list[tuple[JobState, tuple[WorkerAssignment, ...]]] = []
        self.views: dict[object, NodeView] = {}

    def add(self, job: JobState, workers: tuple[WorkerAssignment, ...]) -> None:
        commit(self.state, job, workers)
        self._held.append((job, workers))
        self.note(w.node for w in workers)

    def mark(self) -> int:
        return len(self._held)

    def rollback(self, mark: int) -> None:
        """Release what was booked after ``mark``, last first."""
        while len(self._held) > mark:
            job, workers = self._held.pop()
            release(self.state, job, workers)
            self.note(w.node for w in workers)

    def undo(self) -> None:
        self.views.clear()    # the cycle is over: nothing will read them again
        self.rollback(0)

    def note(self, names: Iterable[str]) -> None:
        if self.views:
            names = tuple(names)
            for view in self.views.values():
                view.touch(names)


@contextmanager
def tentative(state: ClusterState) -> Iterator[Booking]:
    booking = Booking(state)
    try:
        yield booking
    finally:
        booking.undo()
