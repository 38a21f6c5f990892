"""Preemption: which running jobs to stop so a pending job can run.

Pure functions over a ``ClusterState`` snapshot and a ``now`` passed in (no clock, no I/O);
the preemptor service turns the result into ``JobPreempted`` proposals, which the reducer
validates when they come back from the log. A preempted job keeps its GPUs until every
worker reports finished (phase PREEMPTING), then goes back to pending uncharged.

Who may be a victim, what a set of victims costs and how the cheapest set is found:
``gpusched.policies.preemption.victim_rules`` and ``gpusched.policies.preemption.victim_search``, shared with
defragmentation.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Mapping

from gpusched.core import events as ev
from gpusched.core.state import ClusterState, JobState
from gpusched.policies.memory import CycleMemory
from gpusched.policies.queueing.quota import within_limits
from gpusched.policies.preemption.protection import Shield
from gpusched.policies.preemption.search_context import Found, SearchContext
from gpusched.policies.preemption.victim_rules import PreemptionConfig, shield_ends

REASON_DEFRAG = "defragmentation"


@dataclass(frozen=True, slots=True)
class Preemption:
    """Proposal: stop ``victims`` (whole jobs) so ``for_job`` can be placed."""

    for_job: str
    victims: tuple[str, ...]
    reason: str                    # "priority" | "reclaim" | "defragmentation"
    nodes: tuple[str, ...] = ()    # nodes the victims free
    planned_nodes: tuple[str, ...] = ()   # each worker's node in ``for_job``'s plan: its nomination


def preemption_events(state: ClusterState, decision: Preemption, now: float,
                      producer: str = "preemptor") -> list[ev.JobPreempted]:
    """The ``JobPreempted`` proposals of a decision. Ids are derived from the decision (job
    and attempt of both sides), so two replicas proposing the same thing dedupe in the log."""
    beneficiary = state.jobs[decision.for_job]
    out = []
    for vid in decision.victims:
        victim = state.jobs[vid]
        out.append(ev.JobPreempted(
            event_id=f"preempt:{vid}:{victim.attempt}:{decision.for_job}:{beneficiary.attempt}",
            time=now, producer=producer, job_id=vid, attempt=victim.attempt,
            for_job=decision.for_job, reason=f"{decision.reason}: preempted for {decision.for_job}",
            planned_nodes=decision.planned_nodes,
        ))
    return out


# --- public entry points ------------------------------------------------------------------
def victims_for(state: ClusterState, job: JobState, now: float, memory: CycleMemory,
                config: PreemptionConfig = PreemptionConfig()) -> tuple[str, ...] | None:
    """The cheapest set of running jobs to preempt so ``job`` becomes placeable: ``()`` when
    it is placeable already, ``None`` when no set of eligible victims makes it placeable.
    ``memory``: the caller's (the preemptor's, of this state): its index of candidate
    victims and its placer views, brought in step here rather than built for the question."""
    ctx = SearchContext(state, now, config, memory)
    with ctx.tentative() as scratch:
        found = ctx.find(job, scratch)
    if found is None:
        return None
    return tuple(v.job_id for v in found.victims)


@dataclass(frozen=True, slots=True)
class Shields:
    """Why the running jobs of a pending job's pool are, or are not, its victims."""

    shielded: Mapping[Shield, int]       # jobs kept from being victims, by the rule that keeps them
    eligible: int                        # jobs that may be victims now
    next_eligible_at: float | None       # when the first exempt job's exempt time ends

    def summary(self) -> str:
        parts = [f"{n} {reason.value}" for reason, n in sorted(self.shielded.items(), key=lambda kv: kv[0].value)]
        line = f"{self.eligible} eligible" + (f"; {', '.join(parts)}" if parts else "")
        if self.next_eligible_at is not None:
            line += f"; next exempt time ends at {self.next_eligible_at:.0f}"
        return line


def why_no_victims(state: ClusterState, job: JobState, now: float, memory: CycleMemory,
                   config: PreemptionConfig = PreemptionConfig()) -> Shields:
    """What keeps the running jobs of ``job``'s pool from being its victims, as typed reasons
    (``Shield``): the preemptor's explanation when it finds none for ``job``. ``memory``:
    as for ``victims_for`` (the teams' borrowing is read from its index of victims)."""
    ctx = SearchContext(state, now, config, memory)
    reclaim = ctx.may_reclaim(job)
    shielded: Counter[Shield] = Counter()
    eligible, next_at = 0, None
    seen: set[str] = set()
    for node in state.nodes.values():
        if node.info.pool != job.spec.pool:
            continue
        for jid in node.jobs:
            if jid in seen or jid == job.job_id:
                continue
            seen.add(jid)
            victim = state.jobs[jid]
            reason = ctx.shield(victim, job, reclaim)
            if reason is None:
                eligible += 1
                continue
            shielded[reason] += 1
            if reason is Shield.EXEMPT:
                until = shield_ends(victim, job, config)
                next_at = until if next_at is None else min(next_at, until)
    return Shields(dict(shielded), eligible, next_at)


def preemption_decisions(state: ClusterState, now: float, memory: CycleMemory,
                         config: PreemptionConfig = PreemptionConfig(), limit: int = 8) -> list[Preemption]:
    """Preemptions for the pending jobs the scheduler cannot place, highest priority first.

    Pending jobs are walked in priority order (then submission order). One that fits now
    is booked where the scheduler would put it (so the jobs after it do not count that
    capacity); one with a preemption in flight (a nomination younger than
    ``nomination_ttl_s``, or victims already PREEMPTING for it) is skipped; otherwise its
    cheapest victims are chosen, released and the job booked, all tentatively — so two
    decisions of one call never share victims or count the same freed GPUs twice. The
    state is left exactly as it was. ``memory``: what the caller keeps between calls on
    this state, brought in step here: the index of candidate victims (``victim_index``)
    and the placer's views (``placer_views``)."""
    if not state.pending:   # the common case of a quiet cluster, every round: nothing to search
        return []
    ctx = SearchContext(state, now, config, memory)
    out: list[Preemption] = []
    # Shapes no victim set helps this call, with the most work the failed search was allowed
    # to lose: a job of the shape that may lose no more fails too.
    failed: dict[tuple, float] = {}
    unplaceable: set[tuple] = set()   # shapes that do not fit as is, since the last booking
    with ctx.tentative() as scratch:
        for job in ctx.pending_in_order()[: config.max_examined]:
            if len(out) >= limit:
                break
            if not within_limits(state, config.quotas, job):
                continue   # the scheduler would not place it: preempting for it is waste
            spec = job.spec
            fit_shape = (spec.pool, spec.workers, spec.resources)
            if fit_shape not in unplaceable:
                placed = ctx.place(job)
                if placed is not None:
                    scratch.book(job, placed)   # the scheduler places it: hold its GPUs
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
            unplaceable.clear()   # victims may free more than their beneficiary takes
    return out


def _decision(job: JobState, found: Found) -> Preemption:
    nodes = sorted({w.node for v in found.victims for w in v.workers})
    planned = tuple(w.node for w in found.workers)
    return Preemption(job.job_id, tuple(v.job_id for v in found.victims), found.reason, tuple(nodes), planned)
