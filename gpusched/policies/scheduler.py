"""One scheduling cycle in numbered stages: order the pending queue, place what fits,
return proposals and, for every job offered and not placed, why.

``Scheduler.schedule`` runs these stages (as Kueue's ``schedule()`` phases and the
Kubernetes scheduler framework's extension points); each is a narrow component chosen
by configuration when the scheduler is built, from an explicit map of names:

  1. snapshot    the cycle's inputs, read once: the quota tree (the log's policy,
                 ``policy_tree``, else ``SchedulerConfig.quotas``), fair share's memory,
                 live nominations, the parked set, the guarantee hold.
  2. queue sort  the ready jobs in the configured order (``queue``: ``QUEUE_ORDERS``),
                 nominees first (fair share charges them before ranking the rest).
  Then for each job in that order, until ``max_decisions``, ``max_job_test`` or, once it
  took ``min_job_test`` jobs, ``max_cycle_s``, or (fair share) until every
  job left is bound to fail (``_Cycle.exhausted``); a cycle that stopped on
  ``max_job_test`` or ``max_cycle_s`` is continued by the next (with the same memory): past
  the first ``job_test_head`` jobs it takes those not yet tested (``queueing.cursor``):
  3. gate        not offered: parked jobs, and jobs bound to fail: of a shape that
                 failed earlier in this cycle, which no reservation would be made for
                 (``_Cycle.bound_to_fail``).
  4. quota       would its team or org go over a limit (``within_limits``)? Would it
                 borrow what a team waiting below its guarantee keeps back
                 (``guarantee_hold``)?
  5. filter, score, reserve
                 the placement policy (``placement``, with ``placement_args``) chooses
                 every worker's node and GPUs (``place_gang``), booked on the
                 cycle's ``Statement``; a nominee on its nominated nodes (each worker
                 where the preemptor planned it) when they take it, else anywhere.
  6. post-filter capacity kept for other jobs while this one is offered: the nodes
                 nominated for a preemption's beneficiary (``NomineeHold``) and the
                 reservation stage (``RESERVATIONS``: ``backfill`` reserves for the
                 first blocked job and for jobs blocked past a wait bound, up to a
                 depth, and holds what they need).
  7. record      a ``Decision``, or an ``Unplaced`` reason: ``_Cycle.record``, the one
                 place either is written.
  8. park        the jobs not placed are parked for the next cycle at this capacity.

What a cycle keeps for the next (the parked set, the queue keys, the placement and
reservation indexes) is in the caller's ``CycleMemory`` (``policies.memory``), one per
pool state, refreshed at the cycle's start; a caller that keeps nothing passes a new one.

Who writes what: the state is read-only to every stage; tentative writes (bookings,
holds, nominations) go through the cycle's one ``Statement``, rolled back before
``schedule`` returns. ``decisions`` and ``unplaced`` are written by ``record`` only
(``skipped`` by the gate), ``failed`` by ``place`` only, the reservation by its stage
only. The caller (the placer service or the simulator) turns decisions into
``JobPlaced`` events; the reducer validates them when they come back from the log.

Parking (stage 8) and skipping a failed shape (stage 3) are optimisations that change
no decision: parking applies only where every stage's failures depend on free capacity
alone (no reservation stage that holds, no nominations); skipping also with
reservations (``bound_to_fail`` says why), not with nominations.
"""
from __future__ import annotations

import math
import time
from itertools import chain
from dataclasses import dataclass, field
from typing import AbstractSet, Callable, Iterable, Mapping

from gpusched.core.model import WorkerAssignment
from gpusched.core.state import ClusterState, JobState
from gpusched.policies.memory import CycleMemory
from gpusched.policies.placement.gang import place_gang
from gpusched.policies.placement.registry import make_placement
from gpusched.policies.queueing.fairshare import DEFAULT_AGING_S, QueueContext
from gpusched.policies.queueing.guarantee_hold import DEFAULT_GUARANTEE_HOLD_S, GuaranteeHold, guarantee_hold
from gpusched.policies.queueing.keys import QueueKeys
from gpusched.policies.queueing.order import KEYED_ORDERS, QUEUE_KEYS, QUEUE_ORDERS
from gpusched.policies.queueing.parking import parking_applies
from gpusched.policies.queueing.policy_tree import policy_tree
from gpusched.policies.queueing.quota import QueueTree, within_limits
from gpusched.policies.queueing.usage import folded_decay
from gpusched.policies.reservation.backfill import DEFAULT_ESTIMATE_S, Reservation
from gpusched.policies.reservation.nomination import (
    hold_nominated_nodes, live_nominations, nominees_first, place_nominee,
)
from gpusched.policies.reservation.stages import NomineeHold, ReservationRun, reservation_stage
from gpusched.policies.outcomes import CycleResult, Decision, Unplaced
from gpusched.policies.statement import Statement, tentative

__all__ = ["CycleResult", "Decision", "Scheduler", "SchedulerConfig", "Unplaced"]

# A job blocked this long gets a reservation whatever the settings of backfill: short
# enough that a gang's wait is bounded by it plus the runtimes of what it waits on, long
# enough that the many jobs that start within minutes as others end never idle capacity
# for a reservation (Slurm's bf_min_age_reserve, for the same reason).
DEFAULT_RESERVE_AFTER_S = 300.0
# How many jobs of a pool hold reservations at once (Maui's RESERVATIONDEPTH): the head
# of line (EASY) plus the longest-waiting job behind it; each more holds capacity idle and
# costs a sweep a cycle.
DEFAULT_RESERVATION_DEPTH = 2
FAIR_SHARE = "fair-share"
# Jobs a cycle takes from the queue (see ``max_job_test``): each costs ~8 µs on a full
# pool of many shapes (fair share's charge, the gate, offers of shapes not yet failed),
# so this many add ~20 ms to a cycle; a longer queue is tested over several cycles
# (``job_test_head``), a job at position p within 1 + ceil((p - 2,500) / 2,250) cycles.
# Above the simulated workloads' longest queue (openb: ~2,100 jobs), whose decisions it
# thus leaves as an unlimited budget makes them.
DEFAULT_MAX_JOB_TEST = 2_500
# Jobs from the head of the queue that a continued cycle tests again (``queueing.cursor``):
# what is about to be placed is looked at every cycle.
DEFAULT_JOB_TEST_HEAD = 250
# Jobs a cycle takes however long it runs (``max_cycle_s``): twice the head, so that a
# continued round still moves on by at least a head's worth of untested jobs a cycle.
DEFAULT_MIN_JOB_TEST = 2 * DEFAULT_JOB_TEST_HEAD


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """The defaults are what a new cluster should run with: fair share with aging, EASY
    backfill, and a reservation for any job that waited ``reserve_after_s``
    (docs/design/scheduling-fairness.md, "No starvation with the defaults")."""

    queue: str = "fair-share"
    placement: str = "best-fit"
    # The placement policy's arguments (its constructor's keywords, e.g. fgd-lookahead's
    # ``patience``); an unknown name is refused when the scheduler is built.
    placement_args: Mapping[str, float] = field(default_factory=dict)
    max_decisions: int = 10_000     # per cycle, to bound a cycle's latency
    # Jobs taken from the queue per cycle, offered or skipped (Slurm's default_queue_depth
    # and bf_max_job_test): bounds a cycle's work on a long queue; jobs past it are reached
    # by the cycles that continue it (``job_test_head``).
    max_job_test: int = DEFAULT_MAX_JOB_TEST
    # A cycle that stopped on ``max_job_test`` is continued by the next (Slurm's
    # bf_continue, ``queueing.cursor``): that one takes the first ``job_test_head`` jobs of
    # the queue, then only jobs not yet tested. >= max_job_test: every cycle starts at the head.
    job_test_head: int = DEFAULT_JOB_TEST_HEAD
    # A cycle that took ``min_job_test`` jobs stops once it has run this long, seconds (Slurm's
    # max_sched_time), and is continued as on ``max_job_test``: a round moves on by at least
    # ``min_job_test - job_test_head`` jobs a cycle. inf: decisions that depend on no clock.
    max_cycle_s: float = math.inf
    min_job_test: int = DEFAULT_MIN_JOB_TEST
    # Reservations (stage ``backfill``): the first blocked job of a pool gets one at once
    # (``backfill``, EASY), and any blocked job once it has waited ``reserve_after_s``
    # (per pool: ``pool_reserve_after_s``; inf: never), up to ``reservation_depth`` a pool
    # (0: no reservations, stage ``none``). Runtimes: a job's time limit, else its pool's
    # default time limit, else ``default_estimate_s``.
    backfill: bool = True
    reserve_after_s: float = DEFAULT_RESERVE_AFTER_S
    pool_reserve_after_s: Mapping[str, float] = field(default_factory=dict)
    reservation_depth: int = DEFAULT_RESERVATION_DEPTH
    default_estimate_s: float = DEFAULT_ESTIMATE_S
    quotas: QueueTree = field(default_factory=QueueTree)
    # Decay of the usage fair share charges teams for: a setting of the log
    # (``ClusterState.ledger_half_life_s``); kept here for the simulator, which builds its state.
    half_life_s: float = 3600.0
    aging_s: float = DEFAULT_AGING_S     # fair share: a job waiting this long goes first (<= 0: never)
    # How long free capacity below a waiting team's guarantee is not lent (guarantee_hold; <= 0: lent at once).
    guarantee_hold_s: float = DEFAULT_GUARANTEE_HOLD_S


class Scheduler:
    def __init__(self, config: SchedulerConfig = SchedulerConfig(),
                 clock: Callable[[], float] = time.perf_counter) -> None:
        if config.queue not in QUEUE_ORDERS:
            raise ValueError(f"unknown queue policy {config.queue!r}; known: {sorted(QUEUE_ORDERS)}")
        if not (config.max_cycle_s > 0 and config.min_job_test >= 1):
            raise ValueError(f"need max_cycle_s > 0, min_job_test >= 1: {config.max_cycle_s}, {config.min_job_test}")
        self.config = config
        self.clock = clock   # what ``max_cycle_s`` is measured with
        self._order = QUEUE_ORDERS[config.queue]
        self._placement = make_placement(config.placement, **config.placement_args)
        self._reservations = reservation_stage(config)
        self.reservation: Reservation | None = None   # the last cycle's first, for reports
        self.reservations: tuple[Reservation, ...] = ()   # the last cycle's, in the order made

    def cycle(self, state: ClusterState, now: float, memory: CycleMemory) -> list[Decision]:
        """The decisions of one cycle (``schedule``)."""
        return self.schedule(state, now, memory).decisions

    def schedule(self, state: ClusterState, now: float, memory: CycleMemory) -> CycleResult:
        """One cycle. ``memory``: what the caller keeps for this state between cycles
        (``policies.memory``): jobs known not to fit are not offered again (its ``parked``,
        policies.queueing.parking); the waiting jobs' queue keys and shapes are computed
        once, not every cycle (its ``keys``, policies.queueing.keys). Neither changes a
        decision; a cycle stopped on its budget is continued by the next (its ``keys.cursor``)."""
        memory.refresh(state)
        parked, keys = memory.parked, memory.keys
        deadline = self.clock() + self.config.max_cycle_s
        # 1. snapshot
        quotas = policy_tree(state, self.config.quotas)   # the log's, at this state's position
        jobs = state.jobs
        held = guarantee_hold(state, quotas, (jobs[j] for j in state.pending if jobs[j].not_before <= now),
                              now, self.config.guarantee_hold_s)
        parking = parking_applies(state, not self._reservations.capacity_only)
        if not parking:
            parked.clear()
        skip = parked.current(state, now) if parking else frozenset()
        # Fair share's memory is the log's (``folded_decay``): a placer that takes over orders alike.
        nominated = live_nominations(state, now)
        # Tiers are computed with the beneficiaries of preemptions counted (``nominees``).
        context = QueueContext(quotas, folded_decay(state, now), self.config.aging_s, frozenset(nominated))
        # 2. queue sort
        cursor = keys.cursor if self.config.job_test_head < self.config.max_job_test else None
        passed: set[str] | None = set() if cursor is not None else None
        order = self._queue(state, now, context, keys, skip, nominated, passed)
        if cursor is not None:
            order = cursor.order(state, order, self.config.job_test_head, passed, nominated.keys())
        shape_of = keys.shape
        # Where an offer can only place a job or fail its shape (no stage holds capacity
        # for another job), a job whose shape failed earlier in this cycle would fail
        # too: it is not offered. Offering costs more than the rest of the cycle's work
        # for a waiting job, and in a full pool nearly all of them fail.
        skim = not nominated
        capacity_only = self._reservations.capacity_only
        # Once every shape still waiting has failed and none can get a reservation, the
        # rest of the queue would only be skipped: the cycle stops (``_Cycle.exhausted``).
        stoppable = skim and not parking and self.config.queue == FAIR_SHARE
        with tentative(state) as statement:
            memory.indexes.install(state, statement)   # the placement indexes, kept like the keys
            run = _Cycle(self, state, now, statement, quotas, NomineeHold(nominated) if nominated else None, held,
                         memory)
            # The loop runs once per waiting job, thousands a cycle: what it reads is bound once.
            decisions, failed, skipped = run.decisions, run.failed, run.skipped
            max_decisions, max_job_test = self.config.max_decisions, self.config.max_job_test
            # From ``timed`` jobs taken on, the budget is checked: jobs and (if bounded) time.
            timed = min(self.config.min_job_test, max_job_test) if deadline < math.inf else max_job_test
            clock, taken, late = self.clock, 0, False
            for job in order:
                if len(decisions) >= max_decisions:
                    break
                if taken >= timed and (taken >= max_job_test or clock() >= deadline):
                    late = taken < max_job_test
                    break
                taken += 1
                # 3. gate
                if job.job_id in skip:
                    continue
                shape = shape_of(job)
                if skim and ((shape, False) in failed if capacity_only else run.bound_to_fail(job, shape)):
                    skipped.append(job.job_id)   # 7. record, inlined: in a full pool most jobs end here
                    continue
                run.record(job, run.offer(job, shape))   # 4-7
                if stoppable and run.exhausted(keys.waiting_shapes()):
                    break
        if cursor is not None:
            cursor.ended(state, late or (taken >= max_job_test and len(decisions) < max_decisions),
                         (r.job.job_id for r in run.reservations.reservations))
        # 8. park
        if parking:
            # A refusal by the guarantee hold is not about capacity: that job is offered again.
            refused = (j for j, why in run.unplaced.items() if why is not Unplaced.HELD_FOR_GUARANTEE)
            parked.park(state, chain(refused, run.skipped),
                        {d.job_id: (d.attempt, d.workers) for d in run.decisions.values()})
        self.reservation = run.reservations.reservation
        self.reservations = tuple(run.reservations.reservations)
        return CycleResult(list(run.decisions.values()), run.unplaced, run.skipped, skip, self.reservation,
                           self.reservations, quotas)

    def _queue(self, state: ClusterState, now: float, context: QueueContext, keys: QueueKeys,
               parked: AbstractSet[str], nominated: Mapping[str, object],
               passed: set[str] | None = None) -> Iterable[JobState]:
        """The ready jobs in queue order, nominees first. Fair share: taken
        lazily from the per-team queues ``keys`` keeps (``fair_queue``), so a cycle pays
        for the jobs it reaches, not for the whole queue; nominees are first in it. The
        lazy order leaves out the nominees in ``passed`` and, in a continued cycle, the jobs
        the cursor's round already tested (``queueing.cursor``, ``queueing.tested_bounds``)."""
        if self.config.queue == FAIR_SHARE:
            keys.bind(None, state)
            queues = keys.fair_queues()
            queues.sync(state, now, context.aging_s if context.aging_s > 0 else math.inf)
            return nominees_first(queues.order(state, now, context, passed), nominated)
        jobs = state.jobs
        unsorted = parked if self.config.queue in KEYED_ORDERS else ()   # see KEYED_ORDERS
        ready = [jobs[j] for j in state.pending if j not in unsorted and jobs[j].not_before <= now]
        return nominees_first(self._ordered(state, ready, now, context, keys), nominated)

    def _ordered(self, state: ClusterState, ready: list[JobState], now: float, context: QueueContext,
                 keys: QueueKeys) -> list[JobState]:
        key = QUEUE_KEYS.get(self.config.queue)
        keys.bind(key, state)
        if key is None:   # an order that looks at the whole queue (fair share)
            return self._order(state, ready, now, context)
        return sorted(ready, key=keys.key)   # what the order does, with the keys kept


Workers = tuple[WorkerAssignment, ...]


class _Cycle:
    """One cycle's stages 4-7 over the state, through its statement."""

    def __init__(self, scheduler: Scheduler, state: ClusterState, now: float, statement: Statement,
                 quotas: QueueTree, nominees: NomineeHold | None, guarantee: GuaranteeHold | None,
                 memory: CycleMemory) -> None:
        self.config = scheduler.config
        self.placement = scheduler._placement
        self.state, self.now, self.statement, self.quotas = state, now, statement, quotas
        self.nominees, self.guarantee = nominees, guarantee
        self.reservations: ReservationRun = scheduler._reservations.start(statement, now, memory,
                                                                          nominees=nominees is not None)
        self.decisions: dict[str, Decision] = {}      # written by record only
        self.unplaced: dict[str, Unplaced] = {}       # written by record only
        self.skipped: list[str] = []                  # SKIPPED_SAME_SHAPE, written by the gate only
        # (shape, under the reservation's hold) that failed: they fail again, as a cycle
        # only ever takes capacity. Written by place only.
        self.failed: set[tuple] = set()

    def record(self, job: JobState, outcome: Workers | Unplaced) -> None:
        """7. The one place an offered job's outcome is written (the gate's skips are
        appended to ``skipped`` in the loop)."""
        if outcome.__class__ is Unplaced:
            self.unplaced[job.job_id] = outcome
        else:
            self.decisions[job.job_id] = Decision(job.job_id, job.attempt, outcome, self.config.placement,
                                                  backfilled=self.reservations.hold is not None)
            if self.guarantee is not None:
                self.guarantee.placed(job)

    def offer(self, job: JobState, shape) -> Workers | Unplaced:
        """4-6 for ``job``; ``shape``: the number ``QueueKeys`` gave its shape (jobs of one
        shape, their pool, workers and per-worker resources, fit or fail alike)."""
        # 4. quota (counting what the reservation will take)
        reserved = self.reservations.reservation
        if not within_limits(self.state, self.quotas, job, reserved.job if reserved else None):
            return Unplaced.QUOTA
        # A nominee is exempt: what a preemption freed for it is not the hold's to keep.
        if self.guarantee is not None and not self.guarantee.allows(job) \
                and not (self.nominees is not None and job.job_id in self.nominees.nominated):
            return Unplaced.HELD_FOR_GUARANTEE
        # 6. post-filter: the nominee hold around 5 and the reservation stage
        if self.nominees is not None and self.reservations.hold is None:
            bound = self.on_nominated_nodes(job)
            if bound is not None:
                return bound
        kept = self.nominees.kept_from(job, self.decisions) if self.nominees is not None else None
        if kept is None:   # no node to keep from this job (the common case)
            return self.around_reservation(job, shape)
        with hold_nominated_nodes(self.statement, kept):
            outcome = self.around_reservation(job, shape)
        return Unplaced.HELD_FOR_NOMINEE if outcome is Unplaced.NO_FIT else outcome

    def on_nominated_nodes(self, job: JobState) -> Workers | None:
        """5 for a nominee, on the nodes nominated for it only (the nomination binds); None
        when it is no nominee or they do not take it (it is then offered as any job)."""
        nodes = self.nominees.nominated.get(job.job_id)
        return place_nominee(self.state, job, self.placement, self.statement, nodes) if nodes else None

    def around_reservation(self, job: JobState, shape) -> Workers | Unplaced:
        """5 under the reservation stage: free (nothing reserved yet), with the holds
        lifted (a job gone before the reserved jobs start), or held; a failure may make a
        reservation."""
        reservations = self.reservations
        if reservations.hold is None:
            outcome = self.place(job, shape, held=False)
        elif not reservations.spares(job):
            outcome = self.place(job, shape, held=True)
        elif self.known_to_fail(shape, held=False):
            outcome = Unplaced.SKIPPED_SAME_SHAPE
        else:   # gone before any reserved job of its pool starts: may use what is held
            with reservations.lifted():
                outcome = self.place(job, shape, held=False)
        if outcome.__class__ is Unplaced:   # a job behind reservations may get one too (depth)
            reservations.blocked(job, shape, self.decisions)
        return outcome

    def bound_to_fail(self, job: JobState, shape) -> bool:
        """Whether offering ``job`` now can only fail and leave the reservations as they
        are, so the gate may skip it and the cycle's decisions stay the same. Why: within
        a cycle free capacity only shrinks (bookings take it; a hold lifted for a job that
        ends before the shadow time is applied again over what that job left free) and
        reservations only grow in number, their shadow times fixed. A shape that failed
        without the hold fails again, held or not. One that failed under the hold fails
        again under it, and a job is placed under it unless it ends before every shadow
        time of its pool (``spares``): with that shape and an estimate at least as long as
        one not spared, it is not spared either. Left: the reservation it might get when
        blocked, so only where the stage would not reserve for it (``reserves``)."""
        failed, reservations = self.failed, self.reservations
        if (shape, False) not in failed and not (
                (shape, True) in failed and reservations.hold is not None and not reservations.spares(job)):
            return False
        return not reservations.reserves(job, shape)

    def exhausted(self, waiting: Iterable[tuple[int, str]]) -> bool:
        """Whether every job still in the queue is bound to fail (``bound_to_fail``), from
        the (shape, pool) of every job waiting: each shape failed without the hold, and
        none can be reserved for. Failed shapes and reservations only grow within a cycle,
        so that stays true to its end; the cycle's decisions are those of a cycle that
        went on skipping."""
        failed, reservations = self.failed, self.reservations
        return all((shape, False) in failed and not reservations.may_reserve(shape, pool) for shape, pool in waiting)

    def known_to_fail(self, shape, held: bool) -> bool:
        # What fails without the hold fails with it too. Nothing hashed before a failure (WorkerResources: in Python).
        return bool(self.failed) and ((shape, False) in self.failed or held and (shape, True) in self.failed)

    def place(self, job: JobState, shape, held: bool) -> Workers | Unplaced:
        """5. Filter, score and reserve: every worker booked on the statement, or none."""
        if self.known_to_fail(shape, held):
            return Unplaced.SKIPPED_SAME_SHAPE
        workers = place_gang(self.state, job, self.placement, self.statement)
        if workers is not None:
            return workers
        self.failed.add((shape, held))
        return Unplaced.HELD_FOR_RESERVATION if held and (shape, False) not in self.failed else Unplaced.NO_FIT
