"""Defragmentation: move a few checkpointable jobs so a fragmented pool can take a job.

A pending job is *blocked by fragmentation only* when its pool has enough free whole GPUs
of the models it allows for all its workers, yet the placer finds no placement (the free
GPUs are spread over nodes, none with room for a worker). Then we look for a few running
jobs to *move*: preempt them (they checkpoint and requeue, uncharged) so their GPUs
consolidate with free ones, on the condition that

* each moved job is preemptible, checkpointable (``checkpoint_interval_s > 0``), has run
  its exempt time (as for preemption: ``protection``), and is of a priority class no
  higher than the pending job's (its preemption budget does not apply: a move loses at
  most ``defrag_max_work_lost_s``);
* the pending job then fits (``place_gang``, the placer's default scoring), and after
  booking it, every moved job fits again elsewhere in what is left *right now* (each
  checked with ``place_gang`` on the tentative state, booked in turn);
* the work it costs is capped: the moved jobs' work at risk (run time since their last
  checkpoint) sums to at most ``defrag_max_work_lost_s``, and at most
  ``defrag_max_moves`` jobs move.

Which jobs may move and what moves cost is the rule's (``victim_rules``, "defragmentation's
moves": ``may_move``, ``move_cost``, ``move_set_key``). Candidate moves come from the same
node-local search as preemption (``gpusched.policies.preemption.victim_search``), with the
cost of a move set being ``(work at risk, jobs moved, GPU milli moved)``. For a one-worker job every node's minimal
move set is a candidate, cheapest first (up to ``defrag_max_plans`` tried); a gang gets
the greedy multi-node set. As for preemption, the search reads the nodes in order of a
lower bound of their move set's cost (``indexed_search``: here, the least work at risk of
a movable job on the node) and stops once no node left can come among the cheapest;
it decides as the search that steps every node (``stepped_search``,
``tests/unit/policies/preemption/test_kept_placer_views.py``). Only whole-GPU jobs are defragmented (shares and MIG slices
pack inside a GPU and are not blocked by spreading GPUs across nodes).

Decisions are ``Preemption`` with reason ``"defragmentation"``. Like preemption, a call
books its plans tentatively (moved jobs released, the pending job and the moved jobs
placed) so later plans of the same call build on them, and leaves the state untouched.
Like preemption, too, a call reads what the caller's memory keeps between its calls: the
placer's views (``placer_views``) and the index of candidate victims (what is in flight),
brought in step with the log at its start, and each pool's movable jobs
(``kept_movable``), brought in step at its first plan: it decides as a call that builds
them afresh (``tests/unit/policies/preemption/test_kept_placer_views.py``).
"""
from __future__ import annotations

from collections import Counter
from typing import Callable, Iterable, Iterator, Mapping, Sequence

from gpusched.core.model import WorkerAssignment
from gpusched.core.priority import priority_value
from gpusched.core.state import ClusterState, JobState, NodeState
from gpusched.policies.memory import CycleMemory
from gpusched.policies.preemption.decisions import REASON_DEFRAG, Preemption
from gpusched.policies.preemption.indexed_search import IndexedSearch
from gpusched.policies.preemption.kept_movable import KeptEntries, kept_entries
from gpusched.policies.preemption.search_context import SearchContext
from gpusched.policies.preemption.slot_counts import SlotCounts
from gpusched.policies.preemption.victim_index import Entry
from gpusched.policies.queueing.quota import within_limits
from gpusched.policies.statement import Statement
from gpusched.policies.preemption.victim_rules import (
    PreemptionConfig, may_ever_move, may_move, may_move_now, move_bound, move_cost, move_set_key, moves_within_caps)
from gpusched.policies.preemption.victim_search import VictimSearch


def blocked_by_fragmentation(state: ClusterState, job: JobState) -> bool:
    """Enough free whole GPUs in the job's pool and models for all its workers (whether or
    not the placer can use them). Only meaningful for whole-GPU jobs."""
    res = job.spec.resources
    if res.is_share or res.is_mig or res.gpus <= 0:
        return False
    need = job.spec.workers * res.gpus
    free = 0
    for node in state.nodes.values():
        if node.info.pool == job.spec.pool and node.schedulable and res.allows(node.model):
            free += node.free_whole_gpus()
            if free >= need:
                return True
    return False


class FreeWholeGpus:
    """Free whole GPUs of a pool's schedulable nodes, by GPU model, kept for a call through
    its tentative changes: ``blocked_by_fragmentation`` for each pending job without a
    scan of the pool's nodes."""

    def __init__(self, nodes: Mapping[str, NodeState], pool: str) -> None:
        self.nodes, self.pool = nodes, pool
        self.on: dict[str, int] = {}                # node -> its free whole GPUs
        self.by_model: Counter[str] = Counter()
        self.touch([name for name, node in nodes.items() if node.info.pool == pool])

    def touch(self, names: Iterable[str]) -> None:
        for name in names:
            node = self.nodes.get(name)
            if node is None or node.info.pool != self.pool:
                continue
            self.by_model[node.model] -= self.on.pop(name, 0)
            if node.schedulable:   # a cordoned node's GPUs are not free to the placer
                free = self.on[name] = node.free_whole_gpus()
                self.by_model[node.model] += free

    def blocked(self, job: JobState) -> bool:
        """``blocked_by_fragmentation`` on the nodes as they are now."""
        res = job.spec.resources
        if res.is_share or res.is_mig or res.gpus <= 0:
            return False
        free = sum(n for model, n in self.by_model.items() if res.allows(model))
        return free >= job.spec.workers * res.gpus


def _blocked(ctx: SearchContext, job: JobState) -> bool:
    pool = job.spec.pool
    view = ctx.kept_view((FreeWholeGpus, pool), lambda nodes: FreeWholeGpus(nodes, pool))
    if view is None:
        return blocked_by_fragmentation(ctx.state, job)
    assert isinstance(view, FreeWholeGpus)
    return view.blocked(job)


def defrag_decisions(state: ClusterState, now: float, memory: CycleMemory,
                     config: PreemptionConfig = PreemptionConfig(), limit: int = 4) -> list[Preemption]:
    """Move plans for pending jobs blocked by fragmentation only, highest priority first.
    ``memory``: what the caller keeps between calls on this state, as for
    ``preemption_decisions``, and each pool's movable jobs."""
    if not state.pending:   # the common case of a quiet cluster, every round: nothing to search
        return []
    if not any(may_ever_move(state.jobs[j]) for node in state.nodes.values() for j in node.jobs):
        return []   # no job could ever be moved (none checkpoints): no plan to look for
    ctx = SearchContext(state, now, config, memory)
    out: list[Preemption] = []
    with ctx.tentative() as scratch:
        for job in ctx.pending_in_order()[: config.max_examined]:
            if len(out) >= limit:
                break
            if not within_limits(state, config.quotas, job):
                continue
            placed = ctx.place(job)
            if placed is not None:
                scratch.book(job, placed)   # the scheduler places it: hold its GPUs
                continue
            if job.job_id in ctx.in_flight or not _blocked(ctx, job):
                continue
            plan = _plan(ctx, job, scratch)   # booked on the scratch when found
            if plan is not None:
                out.append(plan)
    return out


def defrag_plan(state: ClusterState, job: JobState, now: float, memory: CycleMemory,
                config: PreemptionConfig = PreemptionConfig()) -> tuple[str, ...] | None:
    """The jobs to move so ``job`` fits, or None (not fragmentation-blocked, or no plan
    within the caps). The state is left untouched."""
    ctx = SearchContext(state, now, config, memory)
    with ctx.tentative() as scratch:
        if ctx.place(job) is not None or not blocked_by_fragmentation(state, job):
            return None
        plan = _plan(ctx, job, scratch)
    return None if plan is None else plan.victims


# --- internals ----------------------------------------------------------------------------
def _movable(ctx: SearchContext, victim: JobState, job: JobState) -> bool:
    if victim.job_id == job.job_id or victim.job_id in ctx.taken:
        return False
    return may_move(victim, job, ctx.now, ctx.config)


class MovableEntries:
    """The jobs of a pool's nodes that any pending job may move (``may_move_now``), one
    entry per node they run on, by a lower bound of the key of any move set holding them
    (``move_bound``): ``IndexedSearch``'s candidates, listed afresh: what a call reads
    is the kept listing (``kept_movable``), which lists these entries, and is the key
    of its view in the call's statement. Listed at the call's first plan: what a call's
    scratch changes after that never makes a job movable
    (it books pending jobs and moved ones, taken), and a job it released stays listed but
    is no victim (taken, or released back)."""

    def __init__(self, nodes: Mapping[str, NodeState], jobs: Mapping[str, JobState], pool: str,
                 now: float, config: PreemptionConfig) -> None:
        self.entries: list[Entry] = []
        for name, node in nodes.items():
            if node.info.pool != pool:
                continue
            for jid in node.jobs:
                victim = jobs[jid]
                if may_move_now(victim, now, config):
                    self.entries.append((move_bound(victim, now), 1, name, victim.seq, victim))
        self.entries.sort()   # (bound, 1, node, seq) differ: a node lists a job once

    def candidates(self) -> Iterator[Entry]:
        return iter(self.entries)

    def touch(self, names: Iterable[str]) -> None:
        """Nothing to do (see the class doc)."""


def indexed_search(ctx: SearchContext, job: JobState, scratch: Statement, eligible: Callable,
                   cost: Callable, set_key: Callable) -> VictimSearch:
    """The search of a plan on the call's movable jobs (kept between calls in the
    memory's ``movable``, ``kept_movable``) and worker slots (``SlotCounts``), views kept
    for the call; the nodes' own (``VictimSearch``) where no call is open to keep them."""
    spec, pool, config, now = job.spec, job.spec.pool, ctx.config, ctx.now

    def listed(nodes: Mapping[str, NodeState]) -> KeptEntries:
        return kept_entries(ctx.memory.movable_of(pool), ctx.state, nodes, now, config)

    movable = ctx.kept_view((MovableEntries, pool), listed)
    shape = (SlotCounts, pool, spec.resources, spec.workers)
    slots = ctx.kept_view(shape, lambda nodes: SlotCounts(nodes, pool, spec.resources, spec.workers))
    if movable is None or slots is None:
        return stepped_search(ctx, job, scratch, eligible, cost, set_key)
    assert isinstance(movable, KeptEntries) and isinstance(slots, SlotCounts)
    return IndexedSearch(ctx.state, job, scratch, eligible, cost, set_key, config.defrag_max_moves,
                         movable.candidates(), slots.on, slots.total, frozenset())


def stepped_search(ctx: SearchContext, job: JobState, scratch: Statement, eligible: Callable,
                   cost: Callable, set_key: Callable) -> VictimSearch:
    """The search of a plan stepping every candidate node of the pool."""
    return VictimSearch(ctx.state, job, scratch, eligible, cost, set_key, ctx.config.defrag_max_moves)


def _plan(ctx: SearchContext, job: JobState, scratch: Statement,
          searcher: Callable[..., VictimSearch] = indexed_search) -> Preemption | None:
    now, config = ctx.now, ctx.config

    def cost(v: JobState) -> tuple:
        return move_cost(v, now)

    search = searcher(ctx, job, scratch, lambda v: _movable(ctx, v, job), cost, lambda vs: move_set_key(vs, now))
    if job.spec.workers == 1:
        candidates = [victims for _, _, victims in search.cheapest_steps(config.defrag_max_plans)]
    else:
        victims = search.run()
        candidates = [victims] if victims else []
    for moved in candidates:
        if not moves_within_caps(moved, now, config):
            continue
        placed = _relocate(ctx, job, moved, scratch)
        if placed is not None:
            for v in moved:
                ctx.taken.add(v.job_id)
            nodes = sorted({w.node for v in moved for w in v.workers})
            return Preemption(job.job_id, tuple(v.job_id for v in sorted(moved, key=cost)),
                              REASON_DEFRAG, tuple(nodes), tuple(w.node for w in placed))
    return None


def _relocate(ctx: SearchContext, job: JobState, moved: Sequence[JobState],
              scratch: Statement) -> tuple[WorkerAssignment, ...] | None:
    """Tentatively: release ``moved``, place ``job``, then place every moved job again
    (higher priority first). Kept booked on the scratch, and ``job``'s workers returned,
    when it all fits; undone (None) otherwise."""
    mark = scratch.checkpoint()
    for v in moved:
        scratch.release(v)
    placed = ctx.place(job)
    if placed is None:
        scratch.rollback(mark)
        return None
    scratch.book(job, placed)
    for v in sorted(moved, key=lambda v: (-priority_value(v.spec.priority_class), v.seq)):
        again = ctx.place(v)
        if again is None:
            scratch.rollback(mark)
            return None
        scratch.book(v, again)
    return placed
