"""One preemptor call's view of a state (``SearchContext``): the teams' borrowing and
projected usage, the victims already chosen, the placer's answers, and the victim search
on the index of candidate victims kept between calls (``victim_index``,
``indexed_search``). Who may be a victim and what victims cost is the rule's
(``victim_rules``): asked here per question, never restated.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import AbstractSet, Callable, Iterator, Mapping, Sequence

from gpusched.core.model import JobPhase, WorkerAssignment
from gpusched.core.priority import priority_value
from gpusched.core.services import keeps_minimum
from gpusched.core.state import ClusterState, JobState, NodeState
from gpusched.core.topology import domain_path, pool_levels
from gpusched.policies.memory import CycleMemory
from gpusched.policies.placement.gang import Placement
from gpusched.policies.placement.registry import make_placement
from gpusched.policies.queueing.quota import claims_guarantee
from gpusched.policies.statement import NodeView, Statement, tentative
from gpusched.policies.preemption import victim_rules as rules
from gpusched.policies.preemption.protection import Shield, wait_allowance
from gpusched.policies.preemption.borrowing import TeamLedger
from gpusched.policies.preemption.indexed_search import IndexedSearch
from gpusched.policies.preemption.placer_views import PlacerViews
from gpusched.policies.preemption.slot_counts import ScratchChanges, SlotCounts
from gpusched.policies.preemption.victim_index import VictimIndex
from gpusched.policies.preemption.victim_rules import REASON_PRIORITY, PreemptionConfig


@dataclass(slots=True)
class Found:
    victims: list[JobState]
    workers: tuple[WorkerAssignment, ...]    # where the job goes once they are gone
    reason: str


class SearchContext:
    """One call's view: eligibility, borrowing, projected usage and the victim search.
    ``memory``: the caller's, refreshed for ``state``: its index of candidate victims
    (``victims``, brought in step on first use) and its placer views (``indexes``,
    ``placer_views``)."""

    def __init__(self, state: ClusterState, now: float, config: PreemptionConfig, memory: CycleMemory) -> None:
        memory.refresh(state)
        self.state, self.now, self.config, self.memory = state, now, config, memory
        self.score: Placement = make_placement(config.placement)
        self.taken: set[str] = set()               # victims chosen earlier in this call
        self.via_reclaim: set[str] = set()         # victims eligible only as quota reclaim
        self.extra: dict[str, int] = {}            # team -> milli booked for beneficiaries
        self._ledger: TeamLedger | None = None     # teams' usage and borrowing, built on first use
        self._index: VictimIndex | None = None     # the memory's candidate victims, in step on first use
        self.in_flight = self._in_flight()
        # The placer's views (free-capacity indexes), held for the whole call while a
        # scratch is watched (``tentative``), and between calls in the memory's ``indexes``.
        self._touched = ScratchChanges()
        self._placer = PlacerViews(state, self._touched, memory.indexes, self.score)

    @contextmanager
    def tentative(self) -> Iterator[Statement]:
        """The call's scratch statement (``statement.tentative``), watched: the placer's
        views are built once for the call and told of the nodes the scratch changes
        (bookings, released victims), rather than rebuilt from every node of the pool for
        each pending job ``place`` is asked about (``placer_views``). The kept index of
        victims is brought in step first: it must never take a tentative booking for the
        state's own."""
        self.victim_index()
        try:
            with tentative(self.state) as scratch:
                scratch.views[ScratchChanges] = self._touched
                self._placer.open()
                try:
                    yield scratch
                finally:
                    self._placer.close()
        finally:   # the scratch undone: the index's kept slot counts count its nodes again
            if self._index is not None:
                self._index.count_again(self._touched.ever)
            self._touched.ever.clear()

    # --- what is already under way ------------------------------------------------------
    def _in_flight(self) -> set[str]:
        """Pending jobs with a live preemption: a young nomination or PREEMPTING victims."""
        live = {j for j, (_, at) in self.state.nominations.items()
                if self.now - at < self.config.nomination_ttl_s}
        return live | set(self.victim_index().preempting.values())   # the kept index knows them

    def pending_in_order(self) -> list[JobState]:
        jobs = [self.state.jobs[j] for j in self.state.pending]
        ready = [j for j in jobs if j.not_before <= self.now]
        return sorted(ready, key=lambda j: (-priority_value(j.spec.priority_class), j.seq))

    # --- quota accounting -----------------------------------------------------------------
    def victim_index(self) -> VictimIndex:
        """The candidate victims (and the teams' running jobs), in step with the call's state."""
        if self._index is None:
            self._index = self.memory.victims.refresh(self.state, self.now, self.config)
        return self._index

    def team_jobs(self) -> dict[str, list[JobState]]:
        """Each team's RUNNING or PLACED jobs: those already on their way out (preempted,
        stopping) are neither victims nor usage to reclaim, their GPUs about to be free."""
        return self.victim_index().team_jobs()

    def used(self, team: str) -> int:
        """GPU milli the team holds (not counting jobs being preempted), plus what this call
        booked for it and what its in-flight beneficiaries will take."""
        held = self.ledger().held(team)
        coming = sum(self.state.jobs[j].milli for j in self.in_flight
                     if j in self.state.jobs and self.state.jobs[j].team == team
                     and self.state.jobs[j].phase is JobPhase.PENDING)
        return held + coming + self.extra.get(team, 0)

    def ledger(self) -> TeamLedger:
        """Borrowing (above): a team's jobs ranked once (kept by the index), read through the
        victims taken and the beneficiaries booked since (``borrowing``)."""
        if self._ledger is None:
            self._ledger = TeamLedger(self.team_jobs(), self.config.guaranteed_milli, self.taken, self.extra,
                                      self.victim_index().rankings)
        return self._ledger

    def borrowed(self, job: JobState) -> bool:
        return self.ledger().borrowed(job)

    def wholly_above(self, job: JobState) -> bool:
        return self.ledger().wholly_above(job)

    def may_reclaim(self, job: JobState) -> bool:
        return claims_guarantee(self.used(job.team), job.milli, self.config.guaranteed_milli(job.team))

    # --- eligibility and cost: the rule's (``victim_rules``) --------------------------------
    def eligible(self, victim: JobState, job: JobState, reclaim: bool) -> bool:
        if victim.job_id == job.job_id or victim.job_id in self.taken:
            return False
        return self.shield(victim, job, reclaim) is None

    def shield(self, victim: JobState, job: JobState, reclaim: bool) -> Shield | None:
        """Which rule keeps ``victim`` from being preempted for ``job`` (``reclaim``: ``job``
        may reclaim its team's guarantee), None when it may be (``victim_rules.shield``).
        Notes the victims eligible as reclaim only (a lower class past its budget) in
        ``via_reclaim``."""
        if victim.spec.service and not keeps_minimum(self.state, victim, self.taken):
            return Shield.SERVICE_MINIMUM
        why, reclaim_only = rules.shield(victim, job, reclaim, self.now, self.config, self)
        if reclaim_only:
            self.via_reclaim.add(victim.job_id)
        return why

    def keeps_minimums(self, victims: Sequence[JobState]) -> bool:
        """Whether a set of victims, together with those taken earlier in this call, leaves
        every service its ``min_replicas`` (each victim alone is checked by ``shield``)."""
        taken = set(self.taken)
        for v in victims:
            if v.spec.service and not keeps_minimum(self.state, v, taken):
                return False
            taken.add(v.job_id)
        return True

    def allowance(self, job: JobState) -> float:
        """GPU-seconds of work a preemption for ``job`` may lose now."""
        return wait_allowance(job, self.now, self.config.max_loss_per_wait)

    def cost(self, victim: JobState, mine: int | None = None) -> tuple:
        """A victim's rank (``victim_rules.cost``); ``mine``: the beneficiary's priority."""
        return rules.cost(victim, mine, self.now, self.borrowed(victim))

    def set_key(self, victims: Sequence[JobState], mine: int | None = None) -> tuple:
        """A set of victims' rank (``victim_rules.set_key``)."""
        return rules.set_key(victims, mine, self.now, self.borrowed)

    # --- placement --------------------------------------------------------------------------
    def place(self, job: JobState) -> tuple[WorkerAssignment, ...] | None:
        """Where the placer would put ``job`` on the state as it is now (booked or not)."""
        return self._placer.place(job, self.score)

    def kept_view(self, key: object, build: Callable[[Mapping[str, NodeState]], NodeView]) -> NodeView | None:
        """A view of the nodes kept for the call beside the placer's (``PlacerViews.view``);
        None without a watched scratch."""
        return self._placer.view(key, build)

    def shape(self, job: JobState) -> tuple:
        spec = job.spec
        reclaim = self.may_reclaim(job)
        return (spec.pool, spec.workers, spec.resources, spec.topology, priority_value(spec.priority_class),
                job.team if reclaim else None)

    def find(self, job: JobState, scratch: Statement) -> Found | None:
        """The cheapest victims for ``job`` (empty when it fits as is), with the placement it
        gets once they are gone; the scratch is back at its mark on return."""
        placed = self.place(job)
        if placed is not None:
            return Found([], placed, REASON_PRIORITY)
        reclaim = self.may_reclaim(job)
        mine = priority_value(job.spec.priority_class)
        victims = self._victims(job, scratch, reclaim, mine)
        if victims is None or rules.set_costly(victims, job, self.now, self.config) or not self.keeps_minimums(victims):
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
        return Found(victims, placed, rules.reason(victims, mine, self.via_reclaim))

    def _victims(self, job: JobState, scratch: Statement, reclaim: bool, mine: int) -> list[JobState] | None:
        """The cheapest victims for ``job``; for a gang that requires one domain of a
        topology level, the cheapest inside one such domain (freeing room across two
        would let it run nowhere)."""
        spec = job.spec
        if spec.workers == 1 or not spec.topology.required:
            return self._search(job, scratch, reclaim, mine).run()
        levels = pool_levels(self.state.pool_topology, spec.pool)
        if spec.topology.required not in levels:
            return None
        cut = levels.index(spec.topology.required) + 1
        domains: dict[tuple[str, ...], set[str]] = {}
        for node in self.state.nodes.values():
            if node.info.pool == spec.pool and node.schedulable:
                domains.setdefault(domain_path(node.info, levels)[:cut], set()).add(node.name)
        best: tuple[tuple, list[JobState]] | None = None
        for key in sorted(domains):
            found = self._search(job, scratch, reclaim, mine, domains[key]).run()
            if found is not None:
                cost = self.set_key(found, mine)
                if best is None or cost < best[0]:
                    best = (cost, found)
        return None if best is None else best[1]

    def _search(self, job: JobState, scratch: Statement, reclaim: bool, mine: int,
                within: AbstractSet[str] | None = None) -> IndexedSearch:
        """The victim search for ``job`` on the index of candidate victims (``indexed_search``)."""
        index, spec = self.victim_index(), job.spec
        shape = (SlotCounts, spec.pool, spec.resources, spec.workers)
        slots = self.kept_view(shape, lambda _: index.slot_counts(shape, self._touched.ever))
        most = index.most_freeable(spec.pool, mine, reclaim, self._touched.ever)
        if slots is None:   # no watched scratch: nothing would keep counts true, nor the bound
            slots, most = SlotCounts(self.state.nodes, spec.pool, spec.resources, spec.workers), None
        assert isinstance(slots, SlotCounts)
        return IndexedSearch(self.state, job, scratch, lambda v: self.eligible(v, job, reclaim),
                             lambda v: self.cost(v, mine), lambda vs: self.set_key(vs, mine),
                             self.config.max_victims, index.candidates(spec.pool, mine, job.team, reclaim),
                             slots.on, slots.total, index.spread, most, within)

    def take(self, job: JobState, found: Found, scratch: Statement) -> None:
        """Release the victims and book the job, tentatively, for the rest of this call:
        later searches of the call neither choose those victims again nor count their
        capacity twice."""
        for v in found.victims:
            scratch.release(v)
            self.taken.add(v.job_id)
        scratch.book(job, found.workers)
        self.extra[job.team] = self.extra.get(job.team, 0) + job.milli
