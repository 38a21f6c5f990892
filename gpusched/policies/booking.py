"""Tentative bookings made during one scheduling cycle.

A cycle places many jobs; each must see the ones placed before it. Rather than copying
the state, the cycle books its decisions into the live state (the same ``commit`` the
reducer uses) and releases them all when the cycle ends, leaving the state exactly as
the log made it. This is Kubernetes' assume/forget, bounded by one synchronous call.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from gpusched.core.capacity import commit, release
from gpusched.core.model import WorkerAssignment
from gpusched.core.state import ClusterState, JobState


class Booking:
    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self._held: list[tuple[JobState, tuple[WorkerAssignment, ...]]] = []

    def add(self, job: JobState, workers: tuple[WorkerAssignment, ...]) -> None:
        commit(self.state, job, workers)
        self._held.append((job, workers))

    def undo(self) -> None:
        while self._held:
            job, workers = self._held.pop()
            release(self.state, job, workers)


@contextmanager
def tentative(state: ClusterState) -> Iterator[Booking]:
    booking = Booking(state)
    try:
        yield booking
    finally:
        booking.undo()
