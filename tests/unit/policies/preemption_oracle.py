"""The preemptor's decisions as they were computed before the placer's views were kept for
a whole call: a test oracle, not used by the project. Every ``place`` builds its views
(the free-capacity index and the like) afresh from every node of the pool, and the
scratch statement is a plain ``tentative``; FGD's mix is the state's, counted when the
call starts, and gpu-clustering's node tags read the state's jobs (both lent: ``statement.lend``),
as the project's questions do. Defragmentation's plans step every node of the pool
(``defrag.stepped_search``). ``test_preemption_index``
checks that ``preemption_decisions`` and ``defrag_decisions`` decide exactly as these do.
"""
from __future__ import annotations

from gpusched.core.model import WorkerAssignment
from gpusched.core.state import ClusterState, JobState
from gpusched.policies.memory import CycleMemory
from gpusched.policies.placement.gang import place_gang
from gpusched.policies.preemption.decisions import Preemption, _decision
from gpusched.policies.preemption.defrag import _plan, blocked_by_fragmentation, stepped_search
from gpusched.policies.preemption.search_context import SearchContext
from gpusched.policies.preemption.victim_rules import PreemptionConfig
from gpusched.policies.queueing.quota import within_limits
from gpusched.policies.statement import Statement, lend, tentative


class FreshViewsContext(SearchContext):
    """``SearchContext`` as it was: fresh placer views for every job."""

    def __init__(self, state: ClusterState, now: float, config: PreemptionConfig) -> None:
        super().__init__(state, now, config, CycleMemory())
        lent = Statement(ClusterState())   # the state is the log's here: no scratch yet
        lend(lent, state, self.score)
        self.lent = lent.views

    def place(self, job: JobState) -> tuple[WorkerAssignment, ...] | None:
        view = ClusterState(nodes=self.state.nodes)
        with tentative(view) as statement:
            statement.views.update(self.lent)
            return place_gang(view, job, self.score, statement)


def preemption_decisions(state: ClusterState, now: float,
                         config: PreemptionConfig = PreemptionConfig(), limit: int = 8) -> list[Preemption]:
    if not state.pending:
        return []
    ctx = FreshViewsContext(state, now, config)
    out: list[Preemption] = []
    failed: dict[tuple, float] = {}   # shape -> the allowance its search failed with
    unplaceable: set[tuple] = set()
    with tentative(state) as scratch:
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


def defrag_decisions(state: ClusterState, now: float,
                     config: PreemptionConfig = PreemptionConfig(), limit: int = 4) -> list[Preemption]:
    if not state.pending:
        return []
    ctx = FreshViewsContext(state, now, config)
    out: list[Preemption] = []
    with tentative(state) as scratch:
        for job in ctx.pending_in_order()[: config.max_examined]:
            if len(out) >= limit:
                break
            if not within_limits(state, config.quotas, job):
                continue
            placed = ctx.place(job)
            if placed is not None:
                scratch.book(job, placed)
                continue
            if job.job_id in ctx.in_flight or not blocked_by_fragmentation(state, job):
                continue
            plan = _plan(ctx, job, scratch, stepped_search)
            if plan is not None:
                out.append(plan)
    return out
