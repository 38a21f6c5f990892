"""The cycle's post-filter stages: capacity kept for a job other than the one offered.

Two components of the scheduling cycle (``policies.scheduler``), each narrow:

* a **reservation stage**, chosen by configuration from ``RESERVATIONS``:
  ``backfill``: a job that cannot be placed gets a reservation
  (``backfill.reserve_for_head_of_line``) when it is the first blocked job of its pool
  (``reserve_first``, EASY backfill) or has waited its pool's bound
  (``reserve_after_s``), up to ``depth`` reservations per pool; from then on what the
  reservations need is held while later jobs are offered, and lifted for a job that
  ends before every shadow time of its pool. ``none``: never reserves, never holds.
* the **nominee hold**: nodes a preemption freed are kept for its beneficiary
  (``nomination``) while any other job is offered.

Who writes what: each stage writes the state only through the cycle's ``Statement``
(holds, nominations) and only its own fields (``reservations``, ``holds``,
``unreservable``); the cycle reads them and calls ``blocked`` after a failure.
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Callable, ContextManager, Iterator, Mapping, Protocol, Sequence

from gpusched.core.model import WorkerAssignment
from gpusched.core.state import JobState
from gpusched.policies.memory import CycleMemory
from gpusched.policies.reservation.backfill import (
    DEFAULT_ESTIMATE_S, Reservation, ReservationHold, ends_before, reserve_for_head_of_line, runtime_estimate,
)
from gpusched.policies.reservation.ends import EndIndex
from gpusched.policies.reservation.hosts import KeptHosts
from gpusched.policies.statement import Statement


class Decided(Protocol):
    workers: tuple[WorkerAssignment, ...]


class ReservationRun(Protocol):
    """One cycle's reservation stage."""

    reservation: Reservation | None              # the first made
    reservations: Sequence[Reservation]          # every one, in the order made
    hold: ReservationHold | None   # None until a job is reserved for

    def spares(self, job: JobState) -> bool:
        """Whether ``job`` may use what the hold keeps (it is gone before the reservation starts)."""

    def lifted(self) -> ContextManager[None]:
        """The hold lifted while the block runs."""

    def blocked(self, job: JobState, shape: object, decided: Mapping[str, Decided]) -> None:
        """``job`` could not be placed: reserve for it if the stage does.
        ``decided``: this cycle's decisions so far, booked but not in the log."""

    def reserves(self, job: JobState, shape: object) -> bool:
        """Whether ``blocked`` would try to reserve for ``job`` now."""

    def may_reserve(self, shape: object, pool: str) -> bool:
        """Whether ``blocked`` may yet reserve for some job of ``shape`` in ``pool`` this
        cycle (False: for none, whatever its wait)."""


class ReservationStage(Protocol):
    name: str
    capacity_only: bool   # whether a failure under this stage depends on free capacity alone

    def start(self, statement: Statement, now: float, memory: CycleMemory,
              nominees: bool = True) -> ReservationRun:
        """One cycle's run. ``memory``: the cycle's, where the stage keeps its indexes for
        this state between cycles (``hosts``, ``ends``); ``nominees``: whether nodes may be
        kept for nominees in this cycle."""


class NoReservation:
    """Never reserves: a job that cannot be placed blocks nobody."""

    name = "none"
    capacity_only = True

    def start(self, statement: Statement, now: float, memory: CycleMemory,
              nominees: bool = True) -> "NoReservation":
        return self

    reservation = None
    reservations = ()
    hold = None

    def blocked(self, job, shape, decided) -> None:
        pass

    def reserves(self, job, shape) -> bool:
        return False

    def may_reserve(self, shape, pool) -> bool:
        return False


class Backfill:
    """Reservations, and backfill behind them: a blocked job gets a reservation when it
    is the first blocked job of its pool and ``reserve_first`` is on (EASY backfill), or
    once it has waited its pool's bound (``reserve_after_s``, per pool in
    ``pool_reserve_after_s``; Slurm's bf_min_age_reserve, Maui's reservation delay), as
    long as fewer than ``depth`` jobs of its pool hold one (Maui's RESERVATIONDEPTH).
    Later jobs may only use what cannot delay any reservation: each reservation is
    computed with the earlier ones held until their jobs end (``reserve_for_head_of_line``'s
    ``earlier``). Runtimes come from ``runtime_estimate``: a job without a time limit is
    expected to run its pool's default time limit, else ``default_estimate_s``."""

    name = "backfill"
    capacity_only = False   # a reservation decides what later jobs may use

    def __init__(self, reserve_first: bool = True, reserve_after_s: float = 0.0,
                 pool_reserve_after_s: Mapping[str, float] = {}, depth: int = 1,
                 default_estimate_s: float = DEFAULT_ESTIMATE_S) -> None:
        for name, value in (("reserve_after_s", reserve_after_s), *pool_reserve_after_s.items()):
            if not value >= 0:
                raise ValueError(f"reserve_after_s ({name}) must be >= 0 (inf: never), not {value!r}")
        if depth < 1:
            raise ValueError(f"reservation depth must be >= 1, not {depth!r}")
        if not 0 < default_estimate_s < math.inf:
            raise ValueError(f"default_estimate_s must be > 0 and finite, not {default_estimate_s!r}")
        self.reserve_first = reserve_first
        self.reserve_after_s = reserve_after_s
        self.pool_reserve_after_s = dict(pool_reserve_after_s)
        self.depth = depth
        self.default_estimate_s = default_estimate_s

    def bound(self, pool: str) -> float:
        """How long a job of ``pool`` waits before it gets a reservation."""
        return self.pool_reserve_after_s.get(pool, self.reserve_after_s)

    def start(self, statement: Statement, now: float, memory: CycleMemory,
              nominees: bool = True) -> "_BackfillRun":
        return _BackfillRun(self, statement, now, memory, nominees)


class _BackfillRun:
    def __init__(self, stage: Backfill, statement: Statement, now: float, memory: CycleMemory,
                 nominees: bool = True) -> None:
        self.stage, self.statement, self.now, self.memory = stage, statement, now, memory
        self.estimate = runtime_estimate(statement.state, stage.default_estimate_s)
        self.reservations: list[Reservation] = []   # in the order made
        self.holds: list[ReservationHold] = []      # one per reservation, applied in that order
        self._per_pool: dict[str, int] = {}
        # Shapes that cannot be reserved for (they never fit): holding capacity for them
        # would block the queue for nothing, so the next blocked job is the head.
        self.unreservable: set = set()
        # Each pool's running jobs' ends, listed at its first sweep and read by every later
        # one of this cycle: they do not change within it (``ends``).
        self._ends: dict[str, EndIndex] = {}
        # What the sweeps found at ``now`` (``backfill._offer_at_now``), while only this
        # cycle's bookings and holds change capacity: not with nominations, whose holds
        # (``NomineeHold``) depend on the job offered.
        self.at_now: dict | None = None if nominees else {}
        # The nodes that could ever host each shape (``hosts``), kept between cycles, on
        # the same condition: nominee holds change node status tentatively.
        self.hosts: KeptHosts | None = None
        if not nominees:
            hosts = self.hosts = memory.hosts
            # Which nodes are open, from the log's state: the cycle has booked nothing yet.
            hosts.open.refresh(statement.state)

    @property
    def reservation(self) -> Reservation | None:
        """The first reservation (the head of line's), for reports and quota checks."""
        return self.reservations[0] if self.reservations else None

    @property
    def hold(self) -> ReservationHold | None:
        return self.holds[0] if self.holds else None

    def spares(self, job: JobState) -> bool:
        pool = job.spec.pool
        return all(ends_before(job, self.now, r.shadow_s, self.estimate)
                   for r in self.reservations if r.job.spec.pool == pool)

    @contextmanager
    def lifted(self) -> Iterator[None]:
        for hold in reversed(self.holds):
            hold.lift()
        try:
            yield
        finally:
            for hold in self.holds:
                hold.apply()

    def wants(self, job: JobState) -> bool:
        """Whether ``job``, blocked, is to be reserved for."""
        held = self._per_pool.get(job.spec.pool, 0)
        if held >= self.stage.depth:
            return False
        return (held == 0 and self.stage.reserve_first) or \
            self.now - job.submitted_at >= self.stage.bound(job.spec.pool)

    def reserves(self, job: JobState, shape: object) -> bool:
        return shape not in self.unreservable and self.wants(job)

    def may_reserve(self, shape: object, pool: str) -> bool:
        return shape not in self.unreservable and self._per_pool.get(pool, 0) < self.stage.depth

    def blocked(self, job: JobState, shape: object, decided: Mapping[str, Decided]) -> None:
        if not self.reserves(job, shape):
            return
        booked = {job_id: d.workers for job_id, d in decided.items()}
        pool = job.spec.pool
        earlier = [(r, r.shadow_s + self.estimate(r.job)) for r in self.reservations if r.job.spec.pool == pool]
        index = self._ends.get(pool)
        if index is None:
            index = self._ends[pool] = self._index(pool)
        with self.lifted():   # the sweep holds the earlier reservations itself, as time goes
            reservation = reserve_for_head_of_line(self.statement, job, self.now, booked, self.estimate, earlier,
                                                   index, self.at_now, self.hosts)
        if reservation is None:
            self.unreservable.add(shape)
            return
        self.reservations.append(reservation)
        self._per_pool[pool] = self._per_pool.get(pool, 0) + 1
        hold = ReservationHold(self.statement, reservation)
        hold.apply()
        self.holds.append(hold)


    def _index(self, pool: str) -> EndIndex:
        """``pool``'s ends for this cycle, kept between cycles in the cycle's memory."""
        state = self.statement.state
        # What the estimate reads besides the job: the pools' default time limits, the default.
        setting = (dict(state.pool_limits), self.stage.default_estimate_s)
        return self.memory.ends_of(pool).current(state, pool, self.now, self.estimate, setting)


# The reservation stages by name: one explicit map; constructor keywords are their arguments.
RESERVATIONS: dict[str, Callable[..., ReservationStage]] = {
    "none": NoReservation,
    "backfill": Backfill,
}


def reservation_stage(config) -> ReservationStage:
    """``backfill`` when any job may get a reservation, else ``none``: the stage a
    ``SchedulerConfig`` describes."""
    bounds = (config.reserve_after_s, *config.pool_reserve_after_s.values())
    if config.reservation_depth < 0:
        raise ValueError(f"reservation_depth must be >= 0, not {config.reservation_depth!r}")
    if config.reservation_depth == 0 or not (config.backfill or any(b < math.inf for b in bounds)):
        return RESERVATIONS["none"]()
    return RESERVATIONS["backfill"](reserve_first=config.backfill, reserve_after_s=config.reserve_after_s,
                                    pool_reserve_after_s=config.pool_reserve_after_s,
                                    depth=config.reservation_depth, default_estimate_s=config.default_estimate_s)


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
