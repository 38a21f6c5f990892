"""The victim search as it was before it read a per-round index of candidate victims: a
test oracle, not used by the project. Every search scans all nodes of the job's pool: it
decides each running job's eligibility and cost, counts every node's worker slots and
computes every node's step; a team's borrowing is ranked afresh after every decision and
its usage summed over its jobs, found on the nodes for every call. ``test_victim_index``
checks that ``preemption_decisions`` and ``victims_for`` decide exactly as these do
(``preemption_decisions`` here keeps the placer's views for the call, as the project
does, so only the victim search differs). The rule is the project's own
(``victim_rules``: eligibility, cost, the borrowing order and guarantee arithmetic): the
oracle checks how the search and the borrowing are accelerated, not the rule;
``bench/preemptor_bench.py`` times both.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from gpusched.core.model import JobPhase
from gpusched.core.priority import priority_value
from gpusched.core.state import ClusterState, JobState, NodeState
from gpusched.policies.memory import CycleMemory
from gpusched.policies.preemption.decisions import Preemption, _decision
from gpusched.policies.preemption.search_context import Found, SearchContext
from gpusched.policies.preemption.victim_rules import (
    REASON_PRIORITY, PreemptionConfig, above_guarantee, borrowing_order, crosses_guarantee, reason, set_costly)
from gpusched.policies.preemption.victim_search import could_host, worker_slots
from gpusched.policies.queueing.quota import within_limits
from gpusched.policies.statement import Statement


@dataclass(slots=True)
class FrozenStep:
    key: tuple
    victims: list[JobState]
    gain: int


class FrozenVictimSearch:
    """Node-local greedy search for a minimal, cheap victim set (see the module doc)."""

    def __init__(self, state: ClusterState, job: JobState, scratch: Statement,
                 eligible: Callable[[JobState], bool], cost: Callable[[JobState], tuple],
                 set_key: Callable[[Sequence[JobState]], tuple], max_victims: int | None = None) -> None:
        self.job, self.scratch = job, scratch
        self.state = state
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
        picked = [victims[i] for i in chosen]
        # Greedy by single costs can miss one victim that alone makes the slot and is the
        # cheaper set (one 2-GPU job rather than two 1-GPU jobs): try each, O(victims).
        if len(picked) > 1:
            best = self.set_key(picked)
            free = node.free_whole_gpus(), node.free_cpu, node.free_mem
            for v, (g, c, m) in zip(victims, shares):
                if self._arith_slots(free[0] + g, free[1] + c, free[2] + m, target) >= target \
                        and (key := self.set_key([v])) < best:
                    picked, best = [v], key
        return picked

    def node_step(self, name: str) -> FrozenStep | None:
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
            return FrozenStep(self.set_key(chosen), chosen, gain)
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
        return FrozenStep(self.set_key(chosen), chosen, gain)

    def run(self) -> list[JobState] | None:
        if self.total() >= self.need:
            return []
        steps: dict[str, FrozenStep | None] = {}
        stale = set(self.nodes)
        mark = self.scratch.checkpoint()
        try:
            # Each step frees at least one more slot (``Step.gain >= 1``): about ``need``
            # rounds; it ends anyway once no node has a step left, as every step releases
            # victims not released before.
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
                if self.max_victims is not None and len(self.released) > 4 * self.max_victims:
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
            if self.max_victims is not None and len(self.released) > self.max_victims:
                return None
            return sorted(self.released, key=self.cost)
        finally:
            self.scratch.rollback(mark)


class FrozenSearchContext(SearchContext):
    """``SearchContext`` with the search, the borrowing, the usage and the preemptions in
    flight as they were (a new memory: nothing kept from another call)."""

    def __init__(self, state: ClusterState, now: float, config: PreemptionConfig) -> None:
        self._borrowed: dict[str, tuple[set[str], set[str]]] = {}
        self._found: dict[str, list[JobState]] | None = None
        super().__init__(state, now, config, CycleMemory())

    def _in_flight(self) -> set[str]:
        """Pending jobs with a young nomination or PREEMPTING victims, found on the nodes."""
        live = {j for j, (_, at) in self.state.nominations.items() if self.now - at < self.config.nomination_ttl_s}
        for node in self.state.nodes.values():
            for jid in node.jobs:
                job = self.state.jobs[jid]
                if job.phase is JobPhase.PREEMPTING and job.nominated_by:
                    live.add(job.nominated_by)
        return live

    def team_jobs(self) -> dict[str, list[JobState]]:
        """Each team's running jobs, found on the nodes once for the call."""
        if self._found is None:
            teams: dict[str, dict[str, JobState]] = {}
            for node in self.state.nodes.values():
                for jid in node.jobs:
                    job = self.state.jobs[jid]
                    if job.phase.holds_gpus and job.phase is not JobPhase.PREEMPTING \
                            and job.phase is not JobPhase.STOPPING:
                        teams.setdefault(job.team, {})[jid] = job
            self._found = {t: list(js.values()) for t, js in teams.items()}
        return self._found

    def used(self, team: str) -> int:
        """GPU milli the team holds (not counting jobs being preempted), plus what this call
        booked for it and what its in-flight beneficiaries will take."""
        held = sum(j.milli for j in self.team_jobs().get(team, ()) if j.job_id not in self.taken)
        coming = sum(self.state.jobs[j].milli for j in self.in_flight
                     if j in self.state.jobs and self.state.jobs[j].team == team
                     and self.state.jobs[j].phase is JobPhase.PENDING)
        return held + coming + self.extra.get(team, 0)

    def _ranked(self, team: str) -> tuple[set[str], set[str]]:
        """The team's jobs that are borrowed (their milli crosses the guarantee, or comes
        after it) and those wholly above the guarantee (the team keeps its guarantee
        without them, all of them together)."""
        sets = self._borrowed.get(team)
        if sets is None:
            guarantee = self.config.guaranteed_milli(team)
            mine = [j for j in self.team_jobs().get(team, ()) if j.job_id not in self.taken]
            mine.sort(key=borrowing_order)
            cumulative = self.extra.get(team, 0)   # beneficiaries booked here come first
            sets = (set(), set())
            for j in mine:
                if above_guarantee(cumulative, guarantee):
                    sets[1].add(j.job_id)
                if crosses_guarantee(cumulative, j.milli, guarantee):
                    sets[0].add(j.job_id)
                cumulative += j.milli
            self._borrowed[team] = sets
        return sets

    def borrowed(self, job: JobState) -> bool:
        return job.job_id in self._ranked(job.team)[0]

    def wholly_above(self, job: JobState) -> bool:
        return job.job_id in self._ranked(job.team)[1]

    def find(self, job: JobState, scratch: Statement) -> Found | None:
        """The cheapest victims for ``job`` (empty when it fits as is), with the placement it
        gets once they are gone; the scratch is back at its mark on return."""
        placed = self.place(job)
        if placed is not None:
            return Found([], placed, REASON_PRIORITY)
        reclaim = self.may_reclaim(job)
        mine = priority_value(job.spec.priority_class)
        search = FrozenVictimSearch(self.state, job, scratch, lambda v: self.eligible(v, job, reclaim),
                                    lambda v: self.cost(v, mine), lambda vs: self.set_key(vs, mine),
                                    self.config.max_victims)
        victims = search.run()
        if victims is None or set_costly(victims, job, self.now, self.config):
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
        return Found(victims, placed, reason(victims, mine, self.via_reclaim))

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


def preemption_decisions(state: ClusterState, now: float,
                         config: PreemptionConfig = PreemptionConfig(), limit: int = 8) -> list[Preemption]:
    if not state.pending:
        return []
    ctx = FrozenSearchContext(state, now, config)
    out: list[Preemption] = []
    failed: dict[tuple, float] = {}   # shape -> the allowance its search failed with
    unplaceable: set[tuple] = set()
    with ctx.tentative() as scratch:
        for job in ctx.pending_in_order()[: config.max_examined]:
            if len(out) >= limit:
                break
            if not within_limits(state, config.quotas, job):
                continue
            spec = job.spec
            fit_shape = (spec.pool, spec.workers, spec.resources)
            if fit_shape not in unplaceable:
                placed = ctx.place(job)
                if placed is not None:
                    scratch.book(job, placed)
                    continue
                unplaceable.add(fit_shape)
            if job.job_id in ctx.in_flight:
                continue
            shape, allowance = ctx.shape(job), ctx.allowance(job)
            if allowance <= failed.get(shape, -1.0):
                continue
            found = ctx.find(job, scratch)
            if found is None:
                failed[shape] = allowance
                continue
            ctx.take(job, found, scratch)
            out.append(_decision(job, found))
            unplaceable.clear()
    return out


def victims_for(state: ClusterState, job: JobState, now: float,
                config: PreemptionConfig = PreemptionConfig()) -> tuple[str, ...] | None:
    ctx = FrozenSearchContext(state, now, config)
    with ctx.tentative() as scratch:
        found = ctx.find(job, scratch)
    if found is None:
        return None
    return tuple(v.job_id for v in found.victims)
