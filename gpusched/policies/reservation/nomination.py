"""Nominations: capacity a preemption frees is kept for the job it was made for.

When the preemptor evicts victims for a job, the reducer records the victims' nodes as
nominated for it (``ClusterState.nominations``). Until that job is placed, or the
nomination grows older than its TTL, a scheduling cycle offers the nominee first and
keeps the nominated nodes out of reach of every other job — otherwise an earlier or
equal-priority job (a requeued victim, say) could take the freed GPUs first.

The nomination binds: a nominee is placed on its nominated nodes when it fits there
(``only_nominated_nodes``), and elsewhere only when it does not. The placement policy
alone may prefer another node (best fit: a tighter gap elsewhere), and the capacity the
preemption freed would then go to the next job in the queue — a borrower, whom the next
reclaim takes back from.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterable, Iterator, Mapping

from gpusched.core.model import JobPhase
from gpusched.core.state import ClusterState, JobState
from gpusched.policies.statement import Statement

NOMINATION_TTL_S = 120.0


def live_nominations(state: ClusterState, now: float, ttl_s: float = NOMINATION_TTL_S) -> dict[str, tuple[str, ...]]:
    return {
        job_id: nodes for job_id, (nodes, at) in state.nominations.items()
        if now - at <= ttl_s and state.jobs[job_id].phase is JobPhase.PENDING
    }


def nominees_first(order: Iterable[JobState], nominated: Mapping[str, tuple[str, ...]]) -> Iterable[JobState]:
    """``order`` with the nominees it holds first, in the order they were nominated.

    One preemptor pass decides for several jobs in turn, each booked where the search put
    it before the next is searched (``preemption_decisions``): the freed capacity adds up
    only if the cycle places them in that order too. The reducer keeps nominations in the
    order of their first ``JobPreempted``, which is the order of the decisions."""
    if not nominated:   # the common case: no copy of the whole queue
        return order
    rank = {job_id: i for i, job_id in enumerate(nominated)}
    if isinstance(order, list):
        first = sorted((j for j in order if j.job_id in rank), key=lambda j: rank[j.job_id])
        return first + [j for j in order if j.job_id not in rank]
    return _prefix_in_rank(iter(order), rank)


def _prefix_in_rank(order: Iterator[JobState], rank: dict[str, int]) -> Iterator[JobState]:
    """A lazy order that yields its nominees first (fair share's ``TeamQueues.order``):
    the nominees, re-sorted by ``rank``, then the rest as it comes."""
    prefix: list[JobState] = []
    for job in order:
        if job.job_id not in rank:
            yield from sorted(prefix, key=lambda j: rank[j.job_id])
            yield job
            yield from order
            return
        prefix.append(job)
    yield from sorted(prefix, key=lambda j: rank[j.job_id])


@contextmanager
def hold_nominated_nodes(statement: Statement, nodes: set[str]) -> Iterator[None]:
    """Make ``nodes`` unschedulable (``Statement.nominate``) while the block runs."""
    held = statement.nominate(nodes)
    try:
        yield
    finally:
        statement.unnominate(held)


@contextmanager
def only_nominated_nodes(statement: Statement, nodes: tuple[str, ...]) -> Iterator[None]:
    """Every node but ``nodes`` unschedulable (``Statement.nominate``) while the block runs:
    where a nominee goes when its nominated nodes take it. Costs a pass over the nodes, paid
    once per nominee (a preemption's beneficiary, a few a cycle)."""
    keep = set(nodes)
    held = statement.nominate(n for n in statement.state.nodes if n not in keep)
    try:
        yield
    finally:
        statement.unnominate(held)
