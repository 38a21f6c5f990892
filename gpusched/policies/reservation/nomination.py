"""Nominations: capacity a preemption frees is kept for the job it was made for.

When the preemptor evicts victims for a job, the reducer records the nodes the preemptor
planned the job on (``JobPreempted.planned_nodes``: the node of each worker, the victims'
nodes and any free capacity its plan adds; the victims' nodes for a record without them)
as nominated for it (``ClusterState.nominations``). Until that job is placed, or the
nomination grows older than its TTL, a scheduling cycle offers the nominee first and
keeps the nominated nodes out of reach of every other job — otherwise an earlier or
equal-priority job (a requeued victim, say) could take the freed GPUs first.

The nomination binds: a nominee is placed on its nominated nodes when it fits there
(``place_nominee``), and elsewhere only when it does not. The placement policy alone may
prefer another node (best fit: a tighter gap elsewhere), and the capacity the preemption
freed would then go to the next job in the queue — a borrower, whom the next reclaim
takes back from. The nominated nodes are the plan, not only the victims' nodes, and each
worker goes to its planned node (``place_as_planned``): bound to a victim's node alone,
or left to the gang planner over the planned nodes, a beneficiary planned partly on free
GPUs elsewhere could take the victim's node whole, and with it what was freed there for
the next beneficiary of the same preemptor pass.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterable, Iterator, Mapping

from gpusched.core.model import JobPhase, WorkerAssignment
from gpusched.core.state import ClusterState, JobState
from gpusched.policies.gpu_fit import StateLike, fit
from gpusched.policies.placement.gang import Placement, place_gang
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


def place_nominee(state: StateLike, job: JobState, placement: Placement, statement: Statement,
                  nodes: tuple[str, ...]) -> tuple[WorkerAssignment, ...] | None:
    """Where a nominee goes when its nominated ``nodes`` take it (the nomination binds):
    each worker on its planned node (``place_as_planned``), else anywhere on those nodes
    by ``placement`` (the plan no longer fits, or there is none); None when they do not
    take it (it is then offered as any job)."""
    planned = place_as_planned(state, job, statement, nodes)
    if planned is not None:
        return planned
    with only_nominated_nodes(statement, nodes):
        return place_gang(state, job, placement, statement)


def place_as_planned(state: StateLike, job: JobState, statement: Statement,
                     nodes: tuple[str, ...]) -> tuple[WorkerAssignment, ...] | None:
    """``job``'s workers each on its node of ``nodes`` (one per worker: the preemptor's
    plan), booked as one unit; None, with nothing booked, when any does not fit there.

    Why the plan and not the placement policy over the nominated nodes: the preemptor
    planned each beneficiary before the victims of the next were released. Once all are
    gone a gang would pack onto the fewest nodes (the topology planner), taking from a
    node it shares with a later beneficiary what was freed for that one. Workers on the
    planned nodes in the planned numbers take on each node the GPUs, CPU and memory the
    plan gave them, so every beneficiary of one pass fits. Inside a node, GPUs are picked
    as the gang planner does (``fit``): a share or MIG slice may land on another GPU of
    the node than the plan's. A nomination without a plan (a record of the victims'
    nodes, one per node) is taken as one only when it names as many nodes as workers."""
    if len(nodes) != job.spec.workers:
        return None
    spec, known = job.spec, state.nodes
    mark = statement.checkpoint()
    placed: list[WorkerAssignment] = []
    for name in nodes:
        node = known.get(name)
        slots = fit(node, spec.pool, spec.resources) if node is not None else None
        if slots is None:
            statement.rollback(mark)
            return None
        worker = WorkerAssignment(len(placed), name, slots)
        statement.book(job, (worker,))   # so the next worker sees this one's GPUs taken
        placed.append(worker)
    statement.rollback(mark)   # booked again as one unit, as the reducer applies JobPlaced
    gang = tuple(placed)
    statement.book(job, gang)
    return gang
