"""What a scheduling cycle returns (``scheduler.Scheduler.schedule``): its decisions, and
for every job it reached and did not place, why."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import AbstractSet

from gpusched.core.model import WorkerAssignment
from gpusched.policies.queueing.quota import QueueTree
from gpusched.policies.reservation.backfill import Reservation


@dataclass(frozen=True, slots=True)
class Decision:
    job_id: str
    attempt: int
    workers: tuple[WorkerAssignment, ...]
    policy: str
    backfilled: bool = False        # placed behind a reservation it cannot delay


class Unplaced(enum.Enum):
    """Why a job offered in a cycle was not placed (or, ``PARKED``, not offered)."""

    QUOTA = "quota"                                  # its team or org would go over a limit
    NO_FIT = "no-fit"                                # no nodes take it now
    HELD_FOR_RESERVATION = "held-for-reservation"    # failed while capacity was held for the
                                                     # blocked head of line (may fit without)
    HELD_FOR_NOMINEE = "held-for-nominee"            # failed while nodes were kept for a
                                                     # preemption's beneficiary (may fit without)
    HELD_FOR_GUARANTEE = "held-for-guarantee"        # would borrow what a team waiting below
                                                     # its guarantee keeps back (guarantee_hold)
    SKIPPED_SAME_SHAPE = "skipped-same-shape"        # a job of its shape failed earlier this cycle
    PARKED = "parked"                                # did not fit at this capacity: not offered again


@dataclass(slots=True)
class CycleResult:
    decisions: list[Decision]
    offered: dict[str, Unplaced]          # offered this cycle and not placed, with why
    skipped: list[str]                    # not offered: a job of their shape failed (SKIPPED_SAME_SHAPE)
    # Not offered (``Unplaced.PARKED``): the caller's parked set, as this cycle left it;
    # valid until the next cycle on that set.
    parked: AbstractSet[str] = frozenset()
    reservation: Reservation | None = None        # the first of ``reservations``
    reservations: tuple[Reservation, ...] = ()    # every reservation held, in the order made
    quotas: QueueTree = field(default_factory=QueueTree)   # the policy the cycle ran under

    @property
    def unplaced(self) -> dict[str, Unplaced]:
        """Every job this cycle reached and did not place, with why (parked jobs aside).
        Built when asked: the cycle itself only appends a skipped job's id."""
        return {**dict.fromkeys(self.skipped, Unplaced.SKIPPED_SAME_SHAPE), **self.offered}

    def reason(self, job_id: str) -> Unplaced | None:
        """Why ``job_id`` was not placed by this cycle; None if placed or not reached."""
        why = self.offered.get(job_id)
        if why is None and job_id in self.skipped:
            return Unplaced.SKIPPED_SAME_SHAPE
        return Unplaced.PARKED if why is None and job_id in self.parked else why
