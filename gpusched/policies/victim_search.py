"""The victim search: which running jobs to stop so a pending job fits, shared by
preemption (``gpusched.policies.preemption``) and defragmentation
(``gpusched.policies.defrag``), which differ only in who may be stopped and what a set
of stopped jobs costs.

Who may be a victim of a pending job ``J`` for preemption (``SearchContext.eligible``):

* it holds GPUs and is running (RUNNING or PLACED, not already PREEMPTING), is
  ``preemptible`` and has run at least ``min_runtime_s`` (since it started, or since it was
  placed when it never started);
* and either its priority class is strictly lower than ``J``'s (reason ``priority``), or
  *quota reclaim*: ``J``'s team still fits in its guarantee with ``J``
  (used + J <= guaranteed) and the victim is *borrowed* capacity of another team, whose
  priority may then equal ``J``'s (reason ``reclaim``; never higher).

A team's jobs above its guarantee count as borrowed: the team's running jobs are ranked
(priority class high to low, then oldest first), and a job whose cumulative GPU milli
crosses the guarantee is borrowed, as is every job after it.

Cost. Candidates are ranked one by one by ``(priority, borrowed first, work at risk,
larger first, submission order)``; a *set* of victims is ranked by
``(highest priority in it, non-borrowed milli at that priority, total work at risk,
number of jobs)`` — lowest priority first, then borrowed capacity first, then least work
lost since the last checkpoint, then fewest jobs.

Search (``VictimSearch``). Only nodes that could ever host one worker of ``J`` (pool, model,
size) are looked at. Worker *slots* (how many more workers of ``J`` a node takes now)
are counted with the placer's own ``fits_node``/``pick_gpus``. A *node step* frees at
least one more slot on one node: release that node's eligible victims in cost order until
the slot appears, then put back every victim that turns out unnecessary (most expensive
first). A one-worker job takes the cheapest node step across the cluster — victims all on
one node. A gang repeats the cheapest step until the pool has ``workers`` slots, then drops
victims that are no longer needed. Steps are cached per node and recomputed only for nodes
whose jobs or capacity the last step touched, so a search costs about
``O(candidate nodes x victims per node)`` releases plus ``O(workers)`` step rounds; the
answer is finally checked with ``place_gang`` (the scheduler's placement, default scoring)
on the state with the victims released. Every release is tentative (a ``Statement``)
and undone before returning: the state digest is unchanged.

Gang victims are released whole (a job id covers all its workers). Nothing is found when
no eligible set makes ``J`` placeable: we never preempt for a job that would still not fit.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from gpusched.core.model import JobPhase, WorkerAssignment, WorkerResources
from gpusched.core.priority import priority_value
from gpusched.core.state import ClusterState, JobState, NodeState
from gpusched.policies.gpu_fit import fits_node, pick_gpus
from gpusched.policies.placement import Placement, place_gang
from gpusched.policies.placement_registry import PLACEMENTS, make_placement
from gpusched.policies.quota import QueueTree
from gpusched.policies.statement import Statement, tentative

REASON_PRIORITY = "priority"
REASON_RECLAIM = "reclaim"


@dataclass(frozen=True, slots=True)
class PreemptionConfig:
    min_runtime_s: float = 30.0          # a job runs at least this long before it may be a victim
    max_victims: int = 16                # per pending job
    nomination_ttl_s: float = 120.0      # a nomination younger than this is still in flight
    quotas: QueueTree = field(default_factory=QueueTree)   # team guarantees (borrowing, reclaim)
    placement: str = "best-fit"          # the placement scoring the placer uses
    max_examined: int = 256              # pending jobs looked at per call, to bound its latency
    # Defragmentation (``gpusched.policies.defrag``).
    defrag_max_work_lost_s: float = 600.0   # work at risk of all jobs moved for one pending job
    defrag_max_moves: int = 4               # jobs moved for one pending job
    defrag_max_plans: int = 32              # candidate node plans tried per pending job

    def __post_init__(self) -> None:
        if self.placement not in PLACEMENTS:
            raise ValueError(f"unknown placement policy {self.placement!r}; known: {sorted(PLACEMENTS)}")
        if self.min_runtime_s < 0 or self.max_victims < 1 or self.nomination_ttl_s < 0:
            raise ValueError("min_runtime_s and nomination_ttl_s must be >= 0, max_victims >= 1")

    def guaranteed_milli(self, team: str) -> float:
        return self.quotas.team_quota(team).guaranteed_milli


def worker_slots(statement: Statement, node: NodeState, res: WorkerResources, cap: int) -> int:
    """How many more workers of ``res`` (at most ``cap``) ``node`` takes right now, by the
    placer's own rules (``fits_node`` and ``pick_gpus``); counted by taking them on
    ``statement``, then undone."""
    if cap <= 0 or not node.schedulable or not res.allows(node.model):
        return 0
    if not res.is_share and not res.is_mig:
        n = node.free_whole_gpus() // res.gpus if res.gpus else cap
        if res.cpu_milli:
            n = min(n, node.free_cpu // res.cpu_milli)
        if res.memory_mib:
            n = min(n, node.free_mem // res.memory_mib)
        return max(0, min(n, cap))
    mark = statement.checkpoint()
    taken = 0
    try:
        while taken < cap and fits_node(node, res):
            slots = pick_gpus(node, res)
            if slots is None:
                break
            statement.take(node, res, slots)
            taken += 1
    finally:
        statement.rollback(mark)
    return taken


def could_host(node: NodeState, res: WorkerResources) -> bool:
    """Whether ``node`` could take one worker of ``res`` were it empty (static capacity)."""
    if not res.allows(node.model) or node.info.cpu_milli < res.cpu_milli or node.info.memory_mib < res.memory_mib:
        return False
    healthy = [g for g in node.gpus if g.healthy]
    if res.is_mig:
        return any(g.info.mig_capable and g.mig_slots for g in healthy)
    if res.is_share:
        return any(g.whole_ok and res.gpu_memory_mib <= g.info.memory_mib for g in healthy)
    return sum(1 for g in healthy if g.whole_ok) >= res.gpus


def running_since(job: JobState) -> float:
    return job.started_at or job.placed_at


@dataclass(slots=True)
class Found:
    victims: list[JobState]
    workers: tuple[WorkerAssignment, ...]    # where the job goes once they are gone
    reason: str


@dataclass(slots=True)
class Step:
    key: tuple
    victims: list[JobState]
    gain: int


class SearchContext:
    """One call's view: eligibility, borrowing, projected usage and the victim search."""

    def __init__(self, state: ClusterState, now: float, config: PreemptionConfig) -> None:
        self.state, self.now, self.config = state, now, config
        self.score: Placement = make_placement(config.placement)
        self.taken: set[str] = set()               # victims chosen earlier in this call
        self.extra: dict[str, int] = {}            # team -> milli booked for beneficiaries
        self._team_jobs: dict[str, list[JobState]] | None = None
        self._borrowed: dict[str, set[str]] = {}
        self.in_flight = self._in_flight()

    # --- what is already under way ------------------------------------------------------
    def _in_flight(self) -> set[str]:
        """Pending jobs with a live preemption: a young nomination or PREEMPTING victims."""
        live = {j for j, (_, at) in self.state.nominations.items()
                if self.now - at < self.config.nomination_ttl_s}
        for node in self.state.nodes.values():
            for jid in node.jobs:
                job = self.state.jobs[jid]
                if job.phase is JobPhase.PREEMPTING and job.nominated_by:
                    live.add(job.nominated_by)
        return live

    def pending_in_order(self) -> list[JobState]:
        jobs = [self.state.jobs[j] for j in self.state.pending]
        ready = [j for j in jobs if j.not_before <= self.now]
        return sorted(ready, key=lambda j: (-priority_value(j.spec.priority_class), j.seq))

    # --- quota accounting -----------------------------------------------------------------
    def team_jobs(self) -> dict[str, list[JobState]]:
        if self._team_jobs is None:
            teams: dict[str, dict[str, JobState]] = {}
            for node in self.state.nodes.values():
                for jid in node.jobs:
                    job = self.state.jobs[jid]
                    # Jobs already on their way out (preempted, stopping) are neither
                    # victims nor usage to reclaim: their GPUs are about to be free.
                    if job.phase.holds_gpus and job.phase is not JobPhase.PREEMPTING \
                            and job.phase is not JobPhase.STOPPING:
                        teams.setdefault(job.team, {})[jid] = job
            self._team_jobs = {t: list(js.values()) for t, js in teams.items()}
        return self._team_jobs

    def used(self, team: str) -> int:
        """GPU milli the team holds (not counting jobs being preempted), plus what this call
        booked for it and what its in-flight beneficiaries will take."""
        held = sum(j.milli for j in self.team_jobs().get(team, ()) if j.job_id not in self.taken)
        coming = sum(self.state.jobs[j].milli for j in self.in_flight
                     if j in self.state.jobs and self.state.jobs[j].team == team
                     and self.state.jobs[j].phase is JobPhase.PENDING)
        return held + coming + self.extra.get(team, 0)

    def borrowed(self, job: JobState) -> bool:
        team = job.team
        ids = self._borrowed.get(team)
        if ids is None:
            guarantee = self.config.guaranteed_milli(team)
            mine = [j for j in self.team_jobs().get(team, ()) if j.job_id not in self.taken]
            mine.sort(key=lambda j: (-priority_value(j.spec.priority_class), running_since(j), j.seq))
            cumulative = self.extra.get(team, 0)   # beneficiaries booked here come first
            ids = set()
            for j in mine:
                cumulative += j.milli
                if cumulative > guarantee:
                    ids.add(j.job_id)
            self._borrowed[team] = ids
        return job.job_id in ids

    def may_reclaim(self, job: JobState) -> bool:
        return self.used(job.team) + job.milli <= self.config.guaranteed_milli(job.team)

    # --- eligibility and cost -------------------------------------------------------------
    def eligible(self, victim: JobState, job: JobState, reclaim: bool) -> bool:
        if victim.job_id == job.job_id or victim.job_id in self.taken:
            return False
        if victim.phase not in (JobPhase.RUNNING, JobPhase.PLACED) or not victim.spec.preemptible:
            return False
        if self.now - running_since(victim) < self.config.min_runtime_s:
            return False
        mine, theirs = priority_value(job.spec.priority_class), priority_value(victim.spec.priority_class)
        if theirs < mine:
            return True
        return (reclaim and theirs == mine and victim.team != job.team and self.borrowed(victim))

    def cost(self, victim: JobState) -> tuple:
        return (priority_value(victim.spec.priority_class), not self.borrowed(victim),
                victim.work_at_risk(self.now), -victim.milli, victim.seq, victim.job_id)

    def set_key(self, victims: Sequence[JobState]) -> tuple:
        top = max(priority_value(v.spec.priority_class) for v in victims)
        guaranteed = sum(v.milli for v in victims
                         if priority_value(v.spec.priority_class) == top and not self.borrowed(v))
        work = sum(v.work_at_risk(self.now) for v in victims)
        return (top, guaranteed, round(work, 6), len(victims))

    # --- placement --------------------------------------------------------------------------
    def place(self, job: JobState) -> tuple[WorkerAssignment, ...] | None:
        """Where the placer would put ``job`` on the state as it is now (booked or not)."""
        # The nodes shared (so tentative releases show), the usage table private (so its
        # own tentative bookings never touch the state's): all place_gang reads.
        view = ClusterState(nodes=self.state.nodes)
        with tentative(view) as statement:
            return place_gang(view, job, self.score, statement)

    def shape(self, job: JobState) -> tuple:
        spec = job.spec
        reclaim = self.may_reclaim(job)
        return (spec.pool, spec.workers, spec.resources, priority_value(spec.priority_class),
                job.team if reclaim else None)

    def find(self, job: JobState, scratch: Statement) -> Found | None:
        """The cheapest victims for ``job`` (empty when it fits as is), with the placement it
        gets once they are gone; the scratch is back at its mark on return."""
        placed = self.place(job)
        if placed is not None:
            return Found([], placed, REASON_PRIORITY)
        reclaim = self.may_reclaim(job)
        search = VictimSearch(self, job, scratch, lambda v: self.eligible(v, job, reclaim),
                         self.cost, self.set_key, self.config.max_victims)
        victims = search.run()
        if victims is None:
            return None
        mark = scratch.checkpoint()
        try:
            for v in victims:
                scratch.release(v)
            placed = self.place(job)
        finally:
            scratch.rollback(mark)
        if placed is None:
            return None   # the slot count and the placer disagree (MIG corner): do nothing
        mine = priority_value(job.spec.priority_class)
        reason = REASON_RECLAIM if any(priority_value(v.spec.priority_class) >= mine for v in victims) \
            else REASON_PRIORITY
        return Found(victims, placed, reason)

    def take(self, job: JobState, found: Found, scratch: Statement) -> None:
        """Release the victims and book the job, tentatively, for the rest of this call:
        later searches of the call neither choose those victims again nor count their
        capacity twice."""
        for v in found.victims:
            scratch.release(v)
            self.taken.add(v.job_id)
        scratch.book(job, found.workers)
        self.extra[job.team] = self.extra.get(job.team, 0) + job.milli
        self._borrowed.clear()


class VictimSearch:
    """Node-local greedy search for a minimal, cheap victim set (see the module doc)."""

    def __init__(self, ctx: SearchContext, job: JobState, scratch: Statement,
                 eligible: Callable[[JobState], bool], cost: Callable[[JobState], tuple],
                 set_key: Callable[[Sequence[JobState]], tuple], max_victims: int) -> None:
        self.ctx, self.job, self.scratch = ctx, job, scratch
        self.state = ctx.state
        self.res = job.spec.resources
        self.need = job.spec.workers
        self._cost = cost
        self._costs: dict[str, tuple] = {}
        self.set_key, self.max_victims = set_key, max_victims
        self.nodes: dict[str, NodeState] = {
            n.name: n for n in self.state.nodes.values()
            if n.info.pool == job.spec.pool and n.schedulable and could_host(n, self.res)
        }
        # Eligible victims per candidate node, cheapest first; decided once per search.
        verdict: dict[str, bool] = {}
        self.victims_on: dict[str, list[JobState]] = {}
        for name, node in self.nodes.items():
            found = []
            for jid in node.jobs:
                ok = verdict.get(jid)
                if ok is None:
                    ok = verdict[jid] = eligible(self.state.jobs[jid])
                if ok:
                    found.append(self.state.jobs[jid])
            if found:
                found.sort(key=self.cost)
                self.victims_on[name] = found
        self.slots = {name: worker_slots(scratch, node, self.res, self.need) for name, node in self.nodes.items()}
        self.released: list[JobState] = []
        self.released_ids: set[str] = set()

    def cost(self, victim: JobState) -> tuple:
        key = self._costs.get(victim.job_id)
        if key is None:
            key = self._costs[victim.job_id] = self._cost(victim)
        return key

    def total(self) -> int:
        return sum(self.slots.values())

    def _refresh(self, victims: Iterable[JobState]) -> set[str]:
        touched = {w.node for v in victims for w in v.workers if w.node in self.nodes}
        for name in touched:
            self.slots[name] = worker_slots(self.scratch, self.nodes[name], self.res, self.need)
        return touched

    def _upper_bound_ok(self, name: str, victims: list[JobState]) -> bool:
        """Cheap filter for whole-GPU jobs: even with every victim gone, does the node gain a slot?"""
        res = self.res
        if res.is_share or res.is_mig or not res.gpus:
            return True
        node = self.nodes[name]
        gpus = node.free_whole_gpus() + sum(len(w.gpus) for v in victims for w in v.workers if w.node == name)
        return gpus // res.gpus > self.slots[name]

    def _free(self, victim: JobState, sign: int) -> None:
        """Release (-1) or re-book (+1) a victim on its nodes' counters only: what slot
        counting reads. Cheaper than the reducer's release (no usage, no job sets)."""
        res = victim.spec.resources
        nodes = self.state.nodes
        change = self.scratch.give if sign < 0 else self.scratch.take
        for w in victim.workers:
            change(nodes[w.node], res, w.gpus)

    def _whole_gpu_job(self) -> bool:
        res = self.res
        return res.gpus > 0 and not res.is_share and not res.is_mig

    def _share_on(self, victim: JobState, node: NodeState) -> tuple[int, int, int] | None:
        """(whole healthy GPUs, CPU, memory) the victim frees on ``node``, or None when it
        holds a GPU share or MIG slice there (then slots are counted by booking)."""
        gpus = cpu = mem = 0
        res = victim.spec.resources
        for w in victim.workers:
            if w.node != node.name:
                continue
            for slot in w.gpus:
                if slot.mig_profile or slot.milli != 1000:
                    return None
                if node.gpus[slot.index].healthy:
                    gpus += 1
            cpu += res.cpu_milli
            mem += res.memory_mib
        return gpus, cpu, mem

    def _arith_slots(self, gpus: int, cpu: int, mem: int, cap: int) -> int:
        res = self.res
        n = gpus // res.gpus
        if res.cpu_milli:
            n = min(n, cpu // res.cpu_milli)
        if res.memory_mib:
            n = min(n, mem // res.memory_mib)
        return max(0, min(n, cap))

    def _arith_step(self, name: str, victims: list[JobState]) -> list[JobState] | None | bool:
        """``node_step``'s choice by arithmetic (whole GPUs only); False when it does not apply."""
        node = self.nodes[name]
        shares = []
        for v in victims:
            share = self._share_on(v, node)
            if share is None:
                return False
            shares.append(share)
        target = self.slots[name] + 1
        gpus, cpu, mem = node.free_whole_gpus(), node.free_cpu, node.free_mem
        chosen: list[int] = []
        for i, (g, c, m) in enumerate(shares):
            gpus, cpu, mem = gpus + g, cpu + c, mem + m
            chosen.append(i)
            if self._arith_slots(gpus, cpu, mem, target) >= target:
                break
        else:
            return None
        for i in reversed(chosen[:-1]):
            g, c, m = shares[i]
            if self._arith_slots(gpus - g, cpu - c, mem - m, target) >= target:
                gpus, cpu, mem = gpus - g, cpu - c, mem - m
                chosen.remove(i)
        return [victims[i] for i in chosen]

    def node_step(self, name: str) -> Step | None:
        """Free this node's victims (cheapest first) until it takes one more worker, then put
        back those not needed; the state is unchanged on return."""
        victims = [v for v in self.victims_on.get(name, ()) if v.job_id not in self.released_ids]
        if not victims or self.slots[name] >= self.need or not self._upper_bound_ok(name, victims):
            return None
        node, res = self.nodes[name], self.res
        target = self.slots[name] + 1
        picked = self._arith_step(name, victims) if self._whole_gpu_job() else False
        if picked is None:
            return None
        if picked is not False and all(w.node == name for v in picked for w in v.workers):
            chosen = picked
            if self.need == 1:
                gain = 1
            else:
                gpus, cpu, mem = node.free_whole_gpus(), node.free_cpu, node.free_mem
                for v in chosen:
                    g, c, m = self._share_on(v, node)
                    gpus, cpu, mem = gpus + g, cpu + c, mem + m
                gain = self._arith_slots(gpus, cpu, mem, self.need) - self.slots[name]
            return Step(self.set_key(chosen), chosen, gain)
        chosen = [] if picked is False else list(picked)
        mark = self.scratch.checkpoint()
        try:
            if picked is False:
                for v in victims:
                    self._free(v, -1)
                    chosen.append(v)
                    if worker_slots(self.scratch, node, res, target) >= target:
                        break
                else:
                    return None
                for v in reversed(chosen[:-1]):     # the last one was needed by construction
                    self._free(v, +1)
                    if worker_slots(self.scratch, node, res, target) >= target:
                        chosen.remove(v)
                    else:
                        self._free(v, -1)
            else:
                for v in chosen:
                    self._free(v, -1)
            gain = worker_slots(self.scratch, node, res, self.need) - self.slots[name]
            # A gang victim frees other nodes too: count that gain as well.
            for other in {w.node for v in chosen for w in v.workers if w.node in self.nodes} - {name}:
                gain += worker_slots(self.scratch, self.nodes[other], res, self.need) - self.slots[other]
        finally:
            self.scratch.rollback(mark)
        return Step(self.set_key(chosen), chosen, gain)

    def run(self) -> list[JobState] | None:
        if self.total() >= self.need:
            return []
        steps: dict[str, Step | None] = {}
        stale = set(self.nodes)
        mark = self.scratch.checkpoint()
        try:
            while self.total() < self.need:
                for name in stale:
                    steps[name] = self.node_step(name)
                stale = set()
                best: tuple | None = None
                for name, step in steps.items():
                    if step is None:
                        continue
                    key = (step.key, -step.gain, name)
                    if best is None or key < best[0]:
                        best = (key, name, step)
                if best is None:
                    return None
                step = best[2]
                for v in step.victims:
                    self.scratch.release(v)
                    self.released.append(v)
                    self.released_ids.add(v.job_id)
                if len(self.released) > 4 * self.max_victims:
                    return None
                touched = self._refresh(step.victims)
                stale = touched | {best[1]}
            # Drop victims a later step made unnecessary, most expensive first.
            for v in sorted(self.released, key=self.cost, reverse=True):
                self.scratch.book(v, v.workers)
                self._refresh((v,))
                if self.total() >= self.need:
                    self.released.remove(v)
                else:
                    self.scratch.release(v)
                    self._refresh((v,))
            if len(self.released) > self.max_victims:
                return None
            return sorted(self.released, key=self.cost)
        finally:
            self.scratch.rollback(mark)
