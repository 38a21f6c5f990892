"""EASY backfill: a reservation for the head-of-line job, and a hold that protects it.

When the first job of the queue cannot be placed (typically a big gang on a busy
cluster), smaller jobs behind it would otherwise take every GPU that frees up and the
gang could wait forever. ``reserve_for_head_of_line`` finds when and where it could run:
running jobs are expected to end at ``start + estimate``, so for every node we replay
its jobs' ends in order until the node can host one more worker of the head, and take
the earliest slots across nodes. A job's estimate is its time limit (``max_runtime_s``,
or the pool's default time limit when it was submitted), else the pool's default time
limit now, else the scheduler's ``default_estimate_s`` (``runtime_estimate``): a job
without one would otherwise never be expected to end, and every reservation behind it
would be impossible, so nothing would be reserved at all. The latest of
those times is the *shadow time*. Other jobs may then run (be backfilled) only if they
cannot delay it: they end before the shadow time, or they fit without touching the
capacity the reservation needs (``ReservationHold``).

Both the sweep and the hold change the live state through the cycle's ``Statement``:
the sweep's releases are rolled back before it returns, the hold is lifted and applied
again as the cycle needs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Mapping, Sequence

from gpusched.core.mig import FULL_MASK, parse_profile
from gpusched.core.model import JobPhase, WorkerAssignment
from gpusched.core.state import ClusterState, GpuState, JobState, NodeState
from gpusched.core.topology import domain_path, pool_levels
from gpusched.policies.gpu_fit import fits_node, pick_gpus
from gpusched.policies.reservation.ends import EndIndex, EndWalk
from gpusched.policies.reservation.hosts import KeptHosts, find_hosts
from gpusched.policies.statement import Change, Statement


# What a job without a time limit, in a pool without a default time limit, is expected to
# run, as Slurm's DefaultTime: a day, the usual upper end of a training run between
# checkpoints. Overestimating only makes reservations later and backfill rarer.
DEFAULT_ESTIMATE_S = 24 * 3600.0

Estimate = Callable[[JobState], float]   # a job's expected runtime, seconds (<= 0: unknown)


def runtime_estimate(state: ClusterState, default_s: float = DEFAULT_ESTIMATE_S) -> Estimate:
    """``job``'s expected runtime: its time limit, else its pool's default time limit
    (set after the job was submitted), else ``default_s``."""
    limits = state.pool_limits

    def estimate(job: JobState) -> float:
        return job.time_limit_s or limits.get(job.spec.pool, (0.0, 0.0))[0] or default_s
    return estimate


def _time_limit(job: JobState) -> float:
    return job.time_limit_s


def expected_end(job: JobState, now: float, estimate: Estimate = _time_limit) -> float:
    """When ``job`` should have released its GPUs; ``inf`` when its runtime is unknown.
    A job booked in this cycle (still pending) starts ``now``; one being preempted is
    about to release; one past its estimate ends any moment."""
    if job.phase is JobPhase.PREEMPTING or job.phase is JobPhase.STOPPING:
        return now
    estimate = estimate(job)
    if job.phase is JobPhase.PREEMPTING or job.phase is JobPhase.STOPPING:
        return now
    if estimate <= 0:
        return math.inf
    if job.phase is JobPhase.RUNNING:
        start = job.started_at
    elif job.phase is JobPhase.PLACED:
        start = job.placed_at
    else:
        start = now
    return max(now, start + estimate)


def ends_before(job: JobState, now: float, deadline: float, estimate: Estimate = _time_limit) -> bool:
    runtime = estimate(job)
    return runtime > 0 and now + runtime <= deadline


@dataclass(frozen=True, slots=True)
class Reservation:
    job: JobState
    shadow_s: float                               # when every reserved slot is free
    workers: tuple[WorkerAssignment, ...]


def reserve_for_head_of_line(statement: Statement, job: JobState, now: float,
                             booked: Mapping[str, tuple[WorkerAssignment, ...]] = {},
                             estimate: Estimate = _time_limit,
                             earlier: Sequence[tuple[Reservation, float]] = (),
                             index: EndIndex | None = None,
                             at_now: dict | None = None,
                             hosts: KeptHosts | None = None,
                             ) -> Reservation | None:
    """The earliest slots where every worker of ``job`` fits once running jobs end, or
    None when that never happens (it fits no node, or it waits on jobs of unknown
    runtime). ``booked``: placements made earlier in this cycle, not yet in the log.
    ``earlier``: reservations made before this one, each with when its job is expected
    to end: what they need stays held for them until then (conservative backfill), and
    they must not be held on the statement already (the sweep holds them itself).
    ``index``: the ends of the running jobs of ``job``'s pool at ``now`` with ``estimate``
    (``ends.EndIndex``), built for an earlier sweep of this cycle; built here when None.
    ``at_now``: what earlier sweeps of this cycle found at ``now`` (``_offer_at_now``),
    only where nothing but the cycle's bookings and reservations changed the state since.
    ``hosts``: the nodes that could ever host each shape, kept between cycles (``hosts``),
    likewise only where no tentative change of node status was made.

    Sweeps the expected ends in time order, releasing each on ``statement`` and offering
    its node another worker, until every worker has a slot: the work is proportional to
    the ends before the shadow time, not to the cluster (but for building the index). The
    statement is back at its checkpoint on return."""
    if index is None:
        index = EndIndex(statement.state, job.spec.pool, now, estimate)
    mark = statement.checkpoint()
    try:
        return _sweep(statement, job, now, booked, estimate, earlier, index, at_now, hosts)
    finally:
        statement.rollback(mark)


def _sweep(statement: Statement, job: JobState, now: float, booked: Mapping[str, tuple[WorkerAssignment, ...]],
           estimate: Estimate, earlier: Sequence[tuple[Reservation, float]], index: EndIndex,
           at_now: dict | None, kept_hosts: KeptHosts | None = None) -> Reservation | None:
    state = statement.state
    # Earlier reservations keep what they need until their jobs end: held here, and held
    # again after every release on their nodes, so this job is never given their slots.
    kept = sorted(((end, i, ReservationHold(statement, r)) for i, (r, end) in enumerate(earlier)),
                  key=lambda k: k[:2])
    for _, _, hold in kept:
        hold.apply()
    sweep = _Sweep(job, statement)
    hosts = _offer_at_now(state, sweep, now, at_now, kept_hosts)
    if sweep.done:
        return sweep.reservation(now)
    ends = EndWalk(index, state, hosts, booked, now, estimate)
    while True:
        t = min(ends.next_time(), kept[0][0] if kept else math.inf)
        if t == math.inf:
            break
        lifted: set[str] = set()
        while kept and kept[0][0] <= t:   # an earlier reserved job ends: its hold goes
            hold = kept.pop(0)[2]
            hold.lift()
            lifted.update(hold.nodes)
        holds = [hold for _, _, hold in kept]
        if len(holds) <= 1:
            _release_by_node(statement, sweep, t, ends, sorted(lifted), hosts, holds)
        else:
            freed: dict[str, list[tuple[JobState, tuple[WorkerAssignment, ...]]]] = {}
            while ends.next_time() == t:   # everything ending at t frees at once
                name, holder, here = ends.pop()
                freed.setdefault(name, []).append((holder, here))
            _free_and_offer(statement, sweep, t, freed, lifted | set(freed), hosts, holds)
        if sweep.done:
            return sweep.reservation(t)
    return None


def _release_by_node(statement: Statement, sweep: "_Sweep", t: float, ends: EndWalk, lifted: list[str],
                     hosts: set[str], holds: list["ReservationHold"]) -> None:
    """A sweep's step at ``t`` with at most one hold, node by node (``_release_and_offer``),
    reading the ends at ``t`` as it goes: they come in node order (``ends.End``), so the nodes are released and offered in name
    order, each when its last end at ``t`` is read, and what ends at ``t`` on the nodes
    after the one that completes the job is never read. On a pool where thousands of
    jobs end at one time (placed in one cycle, or all past their estimates: at ``now``)
    that is most of a sweep's work saved."""
    i = 0
    while True:
        at_t = ends.next_time() == t
        if not at_t and i == len(lifted):
            return
        name = ends.next_node() if at_t else lifted[i]
        if i < len(lifted) and lifted[i] <= name:
            name = lifted[i]
            i += 1
        _release_and_offer(statement, sweep, t, name, _ends_at(ends, t, name), hosts, holds)
        if sweep.done:
            return


def _ends_at(ends: EndWalk, t: float, name: str) -> Iterator[tuple[JobState, tuple[WorkerAssignment, ...]]]:
    """The ends at ``t`` on node ``name`` that come next in ``ends``, read as they are taken."""
    while ends.next_time() == t and ends.next_node() == name:
        _, holder, here = ends.pop()
        yield holder, here


def _release_and_offer(statement: Statement, sweep: "_Sweep", t: float, name: str,
                       freed: Iterable[tuple[JobState, tuple[WorkerAssignment, ...]]],
                       hosts: set[str], holds: list["ReservationHold"]) -> None:
    """One node's step of a sweep with at most one hold: release what ends there at ``t``,
    hold again what the earlier reservation needs of it (its share of a node depends on
    that node alone), and offer it the job's remaining workers if it could host one."""
    for holder, here in freed:
        statement.release(holder, here)
    for hold in holds:
        if name in hold.nodes:
            hold.lift()
            hold.apply()
    if name in hosts:
        sweep.offer(statement.state.nodes[name], t)


def _offer_at_now(state: ClusterState, sweep: "_Sweep", now: float, at_now: dict | None,
                  kept: KeptHosts | None = None) -> set[str]:
    """Offer every node that could ever host a worker of the job at ``now``, in the state's
    order, until the job has every worker; the names of those nodes (complete only when
    it has not).

    ``at_now`` (per cycle, by pool and resources): the nodes and, of them, those that took
    a worker, from an earlier sweep that offered every one. Within a cycle capacity at
    ``now`` only shrinks (bookings, and holds, which keep what is free up to a need), so
    a node that took no worker then takes none now: only the others are offered again.
    ``kept``: the nodes that could ever host each shape, and those open, kept between
    cycles (``hosts``): a node not open takes no worker that needs a GPU."""
    job = sweep.job
    key = (job.spec.pool, job.spec.resources)
    memo = at_now.get(key) if at_now is not None else None
    took: list[NodeState] = []
    if memo is not None:
        hosts, nodes = memo
    else:
        # A pool's every node is read once a sweep (or once while nodes stay, ``kept``),
        # so the pass is kept to the checks.
        nodes, hosts = kept.offered_at_now(state, job) if kept is not None else find_hosts(state, job)
    for node in nodes:
        before = len(sweep.found)
        sweep.offer(node, now)
        if len(sweep.found) > before:
            took.append(node)
        if sweep.done:
            return hosts
    if at_now is not None:
        at_now[key] = (hosts, took)
    return hosts


def _free_and_offer(statement: Statement, sweep: "_Sweep", t: float,
                    freed: Mapping[str, list[tuple[JobState, tuple[WorkerAssignment, ...]]]],
                    touched: set[str], hosts: set[str], holds: list["ReservationHold"]) -> None:
    """Release what ends at ``t``, hold again what the earlier reservations need on the
    ``touched`` nodes, and offer those the job can use, in name order: with several holds
    one's share of a node depends on the others', as last computed, so everything is
    released and held again before any offer. (With at most one hold a sweep goes node
    by node: ``_release_by_node``.)"""
    nodes = statement.state.nodes
    for jobs in freed.values():
        for holder, here in jobs:
            statement.release(holder, here)
    for hold in holds:
        if not touched.isdisjoint(hold.nodes):
            hold.lift()
            hold.apply()
    for name in sorted(touched & hosts):
        sweep.offer(nodes[name], t)


class _Sweep:
    """The slots found so far, each booked on the statement. For a gang that requires one
    domain of a topology level, slots count per domain of that level and the sweep is done
    when one domain has them all: the reservation is that domain's (a slice request is not
    looked at here: the held room is the gang's, the planner cuts it into slices)."""

    def __init__(self, job: JobState, statement: Statement) -> None:
        self.job = job
        self.statement = statement
        self.found: list[WorkerAssignment] = []
        self.domain = _required_domain(statement.state, job)
        self.by_domain: dict[tuple[str, ...], list[WorkerAssignment]] = {}
        self.full: list[WorkerAssignment] | None = None

    @property
    def done(self) -> bool:
        return self.full is not None if self.domain is not None else len(self.found) == self.job.spec.workers

    def offer(self, node: NodeState, t: float) -> None:
        """Give ``node`` as many of the remaining workers as it can host now."""
        res, workers = self.job.spec.resources, self.job.spec.workers
        mine = self.found if self.domain is None else self.by_domain.setdefault(self.domain(node), [])
        while len(mine) < workers and fits_node(node, res):
            slots = pick_gpus(node, res)
            if slots is None:
                return
            assignment = WorkerAssignment(len(mine), node.name, slots)
            self.statement.book(self.job, (assignment,))
            mine.append(assignment)
            if mine is not self.found:
                self.found.append(assignment)
        if mine is not self.found and len(mine) == workers:
            self.full = mine

    def reservation(self, shadow: float) -> Reservation:
        return Reservation(self.job, shadow, tuple(self.full if self.full is not None else self.found))


def _required_domain(state: ClusterState, job: JobState) -> Callable[[NodeState], tuple[str, ...]] | None:
    """A node's domain at the level ``job`` requires one of (None: it requires none)."""
    required = job.spec.topology.required
    if not required or job.spec.workers == 1:
        return None
    levels = pool_levels(getattr(state, "pool_topology", {}), job.spec.pool)
    cut = levels.index(required) + 1 if required in levels else 0   # a level gone: one domain, the planner waits
    return lambda node: domain_path(node.info, levels)[:cut]


class ReservationHold:
    """Makes the capacity a reservation needs, as far as it is free now, look taken.

    While applied, a job placed in the state cannot use anything the reserved job will
    need at the shadow time, so it cannot delay it. Only free capacity is held (never
    more than a GPU, CPU or memory has), so the state stays within capacity and
    placement scorers see ordinary numbers. Lift it to place a job that ends before the
    shadow time, then apply it again: it then holds what that job left free, which is
    enough, because that job will be gone when the reservation starts.
    """

    def __init__(self, statement: Statement, reservation: Reservation) -> None:
        self.statement = statement
        self.reservation = reservation
        res = reservation.job.spec.resources
        self._cpu: dict[str, int] = {}
        self._mem: dict[str, int] = {}
        self._milli: dict[tuple[str, int], int] = {}
        self._gpu_mem: dict[tuple[str, int], int] = {}   # GPU memory a reserved share asks
        self._mig: dict[tuple[str, int], int] = {}
        for w in reservation.workers:
            self._cpu[w.node] = self._cpu.get(w.node, 0) + res.cpu_milli
            self._mem[w.node] = self._mem.get(w.node, 0) + res.memory_mib
            for slot in w.gpus:
                key = (w.node, slot.index)
                if slot.mig_profile:
                    self._mig[key] = self._mig.get(key, 0) | parse_profile(slot.mig_profile).mask(slot.mig_start)
                else:
                    self._milli[key] = self._milli.get(key, 0) + slot.milli
                    if res.is_share and res.gpu_memory_mib:
                        self._gpu_mem[key] = self._gpu_mem.get(key, 0) + res.gpu_memory_mib
        self._nodes = tuple(self._cpu)   # every node the reservation uses
        self.nodes = frozenset(self._nodes)
        self._held: tuple[Change, ...] | None = None

    def apply(self) -> None:
        assert self._held is None, "hold applied twice"
        self._held = self._changes()
        self.statement.hold(self._held, self._nodes)

    def lift(self) -> None:
        if self._held is None:
            return
        self.statement.lift(self._held, self._nodes)
        self._held = None

    def _changes(self) -> tuple[Change, ...]:
        """What to hold now: the part of the reservation's needs that is free."""
        nodes = self.statement.state.nodes
        out: list[Change] = []

        def take(target: object, attr: str, amount: int) -> None:
            if amount:
                out.append((target, attr, amount))

        def take_slices(gpu: GpuState, mask: int) -> None:
            take(gpu, "mig_mask", mask & ~gpu.mig_mask)   # only the bits still clear

        for name, cpu in self._cpu.items():
            node = nodes[name]
            take(node, "used_cpu", max(0, min(cpu, node.free_cpu)))
            take(node, "used_mem", max(0, min(self._mem[name], node.free_mem)))
        for (name, index), milli in self._milli.items():
            gpu = nodes[name].gpus[index]
            if gpu.mig_mask:
                take_slices(gpu, FULL_MASK)
            else:
                take(gpu, "used_milli", max(0, min(milli, 1000 - gpu.used_milli)))
                need = self._gpu_mem.get((name, index), 0)
                take(gpu, "used_memory_mib", max(0, min(need, gpu.info.memory_mib - gpu.used_memory_mib)))
        for (name, index), mask in self._mig.items():
            gpu = nodes[name].gpus[index]
            if gpu.used_milli:
                take(gpu, "used_milli", 1000 - gpu.used_milli)
            else:
                take_slices(gpu, mask)
        return tuple(out)
