"""The cycle's post-filter stages: capacity kept for a job other than the one offered.

Two components of the scheduling cycle (``policies.scheduler``), each narrow:

* a **reservation stage**, chosen by configuration from ``RESERVATIONS``:
  ``backfill`` (EASY backfill, argument ``reserve_after_s``): the first job that cannot
  be placed, once it has waited that long, gets a reservation
  (``backfill.reserve_for_head_of_line``); from then on what the reservation needs is
  held while later jobs are offered, and lifted for a job that ends before the shadow
  time. ``none``: never reserves, never holds.
* the **nominee hold**: nodes a preemption freed are kept for its beneficiary
  (``nomination``) while any other job is offered.

Who writes what: each stage writes the state only through the cycle's ``Statement``
(holds, nominations) and only its own fields (``reservation``, ``hold``,
``unreservable``); the cycle reads them and calls ``blocked`` after a failure.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, ContextManager, Iterator, Mapping, Protocol

from gpusched.core.model import WorkerAssignment
from gpusched.core.state import JobState
from gpusched.policies.reservation.backfill import (
    Reservation, ReservationHold, ends_before, reserve_for_head_of_line,
)
from gpusched.policies.statement import Statement


class Decided(Protocol):
    workers: tuple[WorkerAssignment, ...]


class ReservationRun(Protocol):
    """One cycle's reservation stage."""

    reservation: Reservation | None
    hold: ReservationHold | None   # None until a job is reserved for

    def spares(self, job: JobState) -> bool:
        """Whether ``job`` may use what the hold keeps (it is gone before the reservation starts)."""

    def lifted(self) -> ContextManager[None]:
        """The hold lifted while the block runs."""

    def blocked(self, job: JobState, shape: object, decided: Mapping[str, Decided]) -> None:
        """``job`` could not be placed (nothing held yet): reserve for it if the stage does.
        ``decided``: this cycle's decisions so far, booked but not in the log."""


class ReservationStage(Protocol):
    name: str
    capacity_only: bool   # whether a failure under this stage depends on free capacity alone

    def start(self, statement: Statement, now: float) -> ReservationRun: ...


class NoReservation:
    """Never reserves: a job that cannot be placed blocks nobody."""

    name = "none"
    capacity_only = True

    def start(self, statement: Statement, now: float) -> "NoReservation":
        return self

    reservation = None
    hold = None

    def blocked(self, job, shape, decided) -> None:
        pass


class Backfill:
    """EASY backfill: reserve for the first blocked job that has waited ``reserve_after_s``
    (Slurm's bf_min_age_reserve: most blocked jobs start soon anyway, and a reservation
    idles what it holds); later jobs may only use what cannot delay it."""

    name = "backfill"
    capacity_only = False   # a reservation decides what later jobs may use

    def __init__(self, reserve_after_s: float = 0.0) -> None:
        if not reserve_after_s >= 0:
            raise ValueError(f"reserve_after_s must be >= 0, not {reserve_after_s!r}")
        self.reserve_after_s = reserve_after_s

    def start(self, statement: Statement, now: float) -> "_BackfillRun":
        return _BackfillRun(self, statement, now)


class _BackfillRun:
    def __init__(self, stage: Backfill, statement: Statement, now: float) -> None:
        self.stage, self.statement, self.now = stage, statement, now
        self.reservation: Reservation | None = None
        self.hold: ReservationHold | None = None
        # Shapes that cannot be reserved for (they never fit, or only after jobs of
        # unknown runtime): holding capacity for them would block the queue for nothing,
        # so the next blocked job is the head.
        self.unreservable: set = set()

    def spares(self, job: JobState) -> bool:
        return ends_before(job, self.now, self.reservation.shadow_s)

    @contextmanager
    def lifted(self) -> Iterator[None]:
        self.hold.lift()
        try:
            yield
        finally:
            self.hold.apply()

    def blocked(self, job: JobState, shape: object, decided: Mapping[str, Decided]) -> None:
        if (self.hold is not None or shape in self.unreservable
                or self.now - job.submitted_at < self.stage.reserve_after_s):
            return
        booked = {job_id: d.workers for job_id, d in decided.items()}
        reservation = reserve_for_head_of_line(self.statement, job, self.now, booked)
        if reservation is None:
            self.unreservable.add(shape)
            return
        self.reservation = reservation
        self.hold = ReservationHold(self.statement, reservation)
        self.hold.apply()


# The reservation stages by name: one explicit map; constructor keywords are their arguments.
RESERVATIONS: dict[str, Callable[..., ReservationStage]] = {
    "none": NoReservation,
    "backfill": Backfill,
}


class NomineeHold:
    """The nodes nominated for preemption beneficiaries that are still waiting, kept from
    every other job (``nomination``). Nominees are offered first, so by the time other
    jobs are offered the set of waiting nominees no longer changes."""

    def __init__(self, nominated: Mapping[str, tuple[str, ...]]) -> None:
        self.nominated = nominated

    def kept_from(self, job: JobState, decided: Mapping[str, object]) -> set[str] | None:
        """The nodes ``job`` must not use, or None when none (the common case)."""
        if not self.nominated or job.job_id in self.nominated:
            return None
        return {n for j, nodes in self.nominated.items() if j not in decided for n in nodes} or None
