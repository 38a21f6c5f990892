"""One scheduling cycle: order the pending queue, place what fits, return proposals.

The cycle never writes the state for good: every booking, hold and nomination goes
through one ``Statement``, rolled back before the cycle returns.
The caller (the placer service or the simulator) turns decisions into ``JobPlaced``
events; the reducer validates them when they come back from the log.

With ``backfill`` on, the first job that cannot be placed gets a reservation (EASY
backfill, ``backfill``) and the jobs after it are placed only where they cannot delay
it. Quota limits hold for every queue order: a job whose team or org would go over its
limit is skipped. The quotas are the log's (``policy_tree``) once it holds a policy,
else ``SchedulerConfig.quotas``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from gpusched.core.model import WorkerAssignment
from gpusched.core.state import ClusterState, JobState
from gpusched.policies.reservation.backfill import (
    Reservation, ReservationHold, ends_before, reserve_for_head_of_line,
)
from gpusched.policies.queueing.fairshare import DEFAULT_AGING_S, QueueContext
from gpusched.policies.reservation.nomination import hold_nominated_nodes, live_nominations, nominees_first
from gpusched.policies.queueing.parking import ParkedJobs, parking_applies
from gpusched.policies.queueing.policy_tree import policy_tree
from gpusched.policies.placement.gang import place_gang
from gpusched.policies.placement.registry import make_placement
from gpusched.policies.queueing.order import KEYED_ORDERS, QUEUE_KEYS, QUEUE_ORDERS
from gpusched.policies.queueing.keys import QueueKeys
from gpusched.policies.queueing.quota import QueueTree, within_limits
from gpusched.policies.statement import Statement, tentative
from gpusched.policies.queueing.usage import folded_decay


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    queue: str = "priority"
    placement: str = "best-fit"
    max_decisions: int = 10_000     # per cycle, to bound a cycle's latency
    backfill: bool = False          # reserve for the blocked head of line (EASY backfill)
    # Reserve only for a job that has waited this long (Slurm's bf_min_age_reserve):
    # most blocked jobs start soon anyway, and a reservation idles what it holds.
    reserve_after_s: float = 0.0
    quotas: QueueTree = field(default_factory=QueueTree)
    # Decay of the usage fair share charges teams for: a setting of the log
    # (``ClusterState.ledger_half_life_s``); kept here for the simulator, which builds its state.
    half_life_s: float = 3600.0
    aging_s: float = DEFAULT_AGING_S     # fair share: a job waiting this long goes first (<= 0: never)


@dataclass(frozen=True, slots=True)
class Decision:
    job_id: str
    attempt: int
    workers: tuple[WorkerAssignment, ...]
    policy: str
    backfilled: bool = False        # placed behind a reservation it cannot delay


class Scheduler:
    def __init__(self, config: SchedulerConfig = SchedulerConfig()) -> None:
        if config.queue not in QUEUE_ORDERS:
            raise ValueError(f"unknown queue policy {config.queue!r}; known: {sorted(QUEUE_ORDERS)}")
        self.config = config
        self._order = QUEUE_ORDERS[config.queue]
        self._placement = make_placement(config.placement)
        self.reservation: Reservation | None = None   # the last cycle's, for reports

    def cycle(self, state: ClusterState, now: float, parked: ParkedJobs | None = None,
              keys: QueueKeys | None = None) -> list[Decision]:
        """The decisions of one cycle. With ``parked`` (kept by the caller for this state
        between cycles) jobs known not to fit are not offered again (policies.queueing.parking);
        with ``keys`` (kept likewise) the waiting jobs' queue keys and shapes are computed
        once, not every cycle (policies.queueing.keys). Neither changes a decision."""
        parking = parked is not None and parking_applies(state, self.config.backfill)
        if parked is not None and not parking:
            parked.clear()
        skip = parked.current(state, now) if parking else ()
        unsorted = skip if self.config.queue in KEYED_ORDERS else ()   # see KEYED_ORDERS
        jobs = state.jobs
        ready = [jobs[j] for j in state.pending if j not in unsorted and jobs[j].not_before <= now]
        quotas = policy_tree(state, self.config.quotas)   # the log's, at this state's position
        # Fair share's memory is the log's (``folded_decay``): a placer that takes over orders alike.
        context = QueueContext(quotas, folded_decay(state, now), self.config.aging_s)
        nominated = live_nominations(state, now)
        order = nominees_first(self._ordered(state, ready, now, context, keys), nominated)
        shape_of = keys.shape if keys is not None else job_shape
        # Where offering a job can only place it or fail its shape (no backfill reservation
        # to make, no nominee's nodes to hold), a job whose shape failed earlier in this
        # cycle is not offered: it would fail too. Offering costs more than the rest of
        # the cycle's work for a waiting job, and in a full pool nearly all of them fail.
        skim = keys is not None and not self.config.backfill and not nominated
        with tentative(state) as statement:
            run = _CycleRun(self, state, now, statement, quotas)
            for job in order:
                if len(run.decisions) >= self.config.max_decisions:
                    break
                if job.job_id in skip:   # parked
                    continue
                shape = shape_of(job)
                if skim and (shape, False) in run.failed:
                    run.unplaced.append(job.job_id)
                    continue
                if job.job_id in nominated:
                    run.offer(job, shape)
                    continue
                waiting = {n for j, nodes in nominated.items() if j not in run.decisions for n in nodes} \
                    if nominated else None
                if not waiting:   # no node to keep for a nominee: nothing to hold (the common case)
                    run.offer(job, shape)
                    continue
                with hold_nominated_nodes(statement, waiting):
                    run.offer(job, shape)
        if parking:
            parked.park(state, run.unplaced, {d.job_id: (d.attempt, d.workers) for d in run.decisions.values()})
        self.reservation = run.reservation
        return list(run.decisions.values())

    def _ordered(self, state: ClusterState, ready: list[JobState], now: float, context: QueueContext,
                 keys: QueueKeys | None) -> list[JobState]:
        key = QUEUE_KEYS.get(self.config.queue)
        if keys is None:
            return self._order(state, ready, now, context)
        keys.bind(key, state)
        if key is None:   # an order that looks at the whole queue (fair share)
            return self._order(state, ready, now, context)
        return sorted(ready, key=keys.key)   # what the order does, with the keys kept


def job_shape(job: JobState) -> tuple:
    """What decides whether a job fits: jobs of one shape fit or fail alike."""
    spec = job.spec
    return (spec.pool, spec.workers, spec.resources)


class _CycleRun:
    """The bookkeeping of one cycle: decisions so far, shapes known not to fit, and the
    reservation with its hold once the head of line is blocked."""

    def __init__(self, scheduler: Scheduler, state: ClusterState, now: float, statement: Statement,
                 quotas: QueueTree) -> None:
        self.config = scheduler.config
        self.quotas = quotas
        self.placement = scheduler._placement
        self.state, self.now, self.statement = state, now, statement
        self.decisions: dict[str, Decision] = {}
        self.unplaced: list[str] = []   # offered, and over quota or not fitting
        # Shapes that failed this cycle fail again: a cycle only ever takes capacity.
        self.failed: set[tuple] = set()
        self.unreservable: set[tuple] = set()
        self.reservation: Reservation | None = None
        self.hold: ReservationHold | None = None

    def offer(self, job: JobState, shape=None) -> None:
        """Place ``job`` if it fits (and its quota allows); ``shape``: its ``job_shape``
        or the number ``QueueKeys`` gave that shape."""
        reserved = self.reservation.job if self.reservation else None
        if not within_limits(self.state, self.quotas, job, reserved):
            self.unplaced.append(job.job_id)
            return
        if shape is None:
            shape = job_shape(job)
        if self.hold is None:
            workers = self.place(job, shape, held=False)
            if (workers is None and self.config.backfill and shape not in self.unreservable
                    and self.now - job.submitted_at >= self.config.reserve_after_s):
                self.reserve(job, shape)
        elif ends_before(job, self.now, self.reservation.shadow_s):
            # Gone before the reserved job starts: it may use what the hold keeps.
            workers = None
            if not self.known_to_fail(shape, held=False):
                self.hold.lift()
                workers = self.place(job, shape, held=False)
                self.hold.apply()
        else:
            workers = self.place(job, shape, held=True)
        if workers is None:
            self.unplaced.append(job.job_id)
        else:
            self.decisions[job.job_id] = Decision(job.job_id, job.attempt, workers, self.config.placement,
                                                  backfilled=self.hold is not None)

    def known_to_fail(self, shape: tuple, held: bool) -> bool:
        # What fails without the hold fails with it too.
        return (shape, False) in self.failed or (shape, held) in self.failed

    def place(self, job: JobState, shape: tuple, held: bool) -> tuple[WorkerAssignment, ...] | None:
        if self.known_to_fail(shape, held):
            return None
        workers = place_gang(self.state, job, self.placement, self.statement)
        if workers is None:
            self.failed.add((shape, held))
        return workers

    def reserve(self, job: JobState, shape: tuple) -> None:
        booked = {d.job_id: d.workers for d in self.decisions.values()}
        reservation = reserve_for_head_of_line(self.statement, job, self.now, booked)
        if reservation is None:
            # It never fits, or only after jobs of unknown runtime: holding capacity for
            # it would block the queue for nothing, so the next blocked job is the head.
            self.unreservable.add(shape)
            return
        self.reservation = reservation
        self.hold = ReservationHold(self.statement, reservation)
        self.hold.apply()
