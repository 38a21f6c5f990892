"""The victim search: the cheapest set of running jobs whose release makes room for a
pending job, given who may be stopped (``eligible``) and what jobs and sets cost
(``cost``, ``set_key``): preemption's rules (``gpusched.policies.preemption.victim_rules``) or
defragmentation's (``gpusched.policies.preemption.defrag``).

For a pending job ``J``, only nodes that could ever host one of its workers (pool,
model, size) are looked at. Worker *slots* (how many more workers of ``J`` a node takes now)
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

What bounds the search is its *work*, not the number of victims: every step frees at least
one more worker slot, so a search takes about ``workers`` steps (``J``'s own worker
count), each recomputing only the nodes the last step touched. The victims of a 4-node x
8-GPU gang on nodes full of 1-GPU jobs are 32 jobs, and the search finds them in 4 steps.
A cap on the victim count (``max_victims``) is an opt-in of the caller (defragmentation
moves at most ``defrag_max_moves`` jobs); preemption has none by default, since a cap below
what a large request needs would leave a placeable job waiting forever.

This class computes every candidate node's step before the first pick, so one search
costs about the pool's size; preemption's and defragmentation's searches run the same
steps on candidate victims ordered by a lower bound of a step's key instead
(``indexed_search.IndexedSearch``), which reads only the nodes that can hold the cheapest
steps.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from gpusched.core.model import WorkerResources
from gpusched.core.state import ClusterState, JobState, NodeState
from gpusched.policies.gpu_fit import fits_node, pick_gpus
from gpusched.policies.statement import Statement


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


@dataclass(slots=True)
class Step:
    key: tuple
    victims: list[JobState]
    gain: int


class VictimSearch:
    """Node-local greedy search for a minimal, cheap victim set (see the module doc)."""

    def __init__(self, state: ClusterState, job: JobState, scratch: Statement,
                 eligible: Callable[[JobState], bool], cost: Callable[[JobState], tuple],
                 set_key: Callable[[Sequence[JobState]], tuple], max_victims: int | None = None) -> None:
        self._begin(state, job, scratch, eligible, cost, set_key, max_victims)
        self.nodes: dict[str, NodeState] = {
            n.name: n for n in self.state.nodes.values()
            if n.info.pool == job.spec.pool and n.schedulable and could_host(n, self.res)
        }
        # Eligible victims per candidate node, cheapest first.
        self.victims_on: dict[str, list[JobState]] = {}
        jobs = self.state.jobs
        for name, node in self.nodes.items():
            found = [jobs[jid] for jid in node.jobs if self.eligible(jobs[jid])]
            if found:
                found.sort(key=self.cost)
                self.victims_on[name] = found
        self.slots = {name: worker_slots(scratch, node, self.res, self.need) for name, node in self.nodes.items()}

    def _begin(self, state: ClusterState, job: JobState, scratch: Statement,
               eligible: Callable[[JobState], bool], cost: Callable[[JobState], tuple],
               set_key: Callable[[Sequence[JobState]], tuple], max_victims: int | None) -> None:
        """What every search of ``job`` starts with, however it finds its nodes: the rules
        (eligibility and cost, each decided once per job and search) and no victim released."""
        self.job, self.scratch, self.state = job, scratch, state
        self.res, self.need = job.spec.resources, job.spec.workers
        self._eligible, self._verdict = eligible, {}
        self._cost, self._costs = cost, {}
        self.set_key, self.max_victims = set_key, max_victims
        self.released: list[JobState] = []
        self.released_ids: set[str] = set()

    def eligible(self, victim: JobState) -> bool:
        ok = self._verdict.get(victim.job_id)
        if ok is None:
            ok = self._verdict[victim.job_id] = self._eligible(victim)
        return ok

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

    def cheapest_steps(self, k: int) -> list[tuple[tuple, str, list[JobState]]]:
        """The ``k`` cheapest node steps (key, node, victims), by key then node name:
        defragmentation's candidate plans for a one-worker job."""
        steps = [(step.key, name, step.victims) for name in self.nodes
                 if (step := self.node_step(name)) is not None]
        steps.sort(key=lambda s: (s[0], s[1]))
        return steps[:k]

    def run(self) -> list[JobState] | None:
        if self.total() >= self.need:
            return []
        steps: dict[str, Step | None] = {}
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
                touched = self._take(step)
                if touched is None:
                    return None
                stale = touched | {best[1]}
            return self._drop_unneeded()
        finally:
            self.scratch.rollback(mark)

    def _take(self, step: Step) -> set[str] | None:
        """Release ``step``'s victims on the scratch state; the nodes whose steps that
        changed (None: far past ``max_victims``, the search gives up)."""
        for v in step.victims:
            self.scratch.release(v)
            self.released.append(v)
            self.released_ids.add(v.job_id)
        if self.max_victims is not None and len(self.released) > 4 * self.max_victims:
            return None
        return self._refresh(step.victims)

    def _drop_unneeded(self) -> list[JobState] | None:
        """Drop victims a later step made unnecessary, most expensive first; the victims
        left, cheapest first (None: more than ``max_victims``)."""
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
