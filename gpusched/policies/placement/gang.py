"""Placement: choose nodes and GPUs for every worker of a gang, or nothing.

A placement policy (``Placement``) chooses the node and GPUs of one worker; policies are
listed by name in ``registry.PLACEMENTS`` and chosen by configuration.
``place_gang`` places a one-worker job with the policy (in a pool that declares its
topology levels, moved out of an untouched lowest-level domain where a domain already in
use takes it: ``keep_domains_whole``), and a gang with the topology planner
(``topology``: fewest racks, then fewest nodes), booking each worker so the
next sees it and giving up the whole gang if any worker does not fit (all-or-nothing).
Topology comes first for a gang (its workers talk every step, so it stays compact); among
the plans and nodes topology rates alike, the policy decides, through its ``rank`` of the
candidate nodes (``node_ranks``; registration order for a policy without one).

Every policy breaks ties by node registration order (the order of ``state.nodes``), so a
decision is a pure function of the state. The policies themselves live in
``heuristics`` (indexed best-fit, the FGD paper's baselines) and
``fgd`` (FGD, and ``fgd-lookahead``: ours).
"""
from __future__ import annotations

from typing import Mapping, Protocol, Sequence

from gpusched.core.model import GpuSlot, WorkerAssignment, WorkerResources
from gpusched.core.state import JobState, NodeState
from gpusched.policies.statement import Statement
from gpusched.policies.gpu_fit import StateLike, fit
from gpusched.policies.placement.topology import keep_domains_whole, place_spread

Choice = tuple[NodeState, tuple[GpuSlot, ...]]


class Placement(Protocol):
    name: str

    def choose(self, state: StateLike, statement: Statement, job: JobState,
               res: WorkerResources) -> Choice | None:
        """Where one worker of ``job`` (needing ``res``) goes now, or None if nowhere."""

    # Optional: rank(state, statement, job, res, nodes) -> {node name: rank}, lower
    # preferred, distinct (ties broken by registration order), over ``nodes``: nodes of
    # the job's pool that each take one worker of ``res`` now. Scores a gang's nodes.
    # Optional: rank_key(state, statement, job, res) -> a sort key of one node (or None):
    # the order ``rank`` gives, for a gang that needs to rank only some of its nodes.
    # Optional: lend(lent, statement): what it counts of a state lent to the statement
    # (``statement.lend``), counted while that state is the log's (FGD's mixes).


def node_ranks(policy: Placement, state: StateLike, statement: Statement, job: JobState,
               res: WorkerResources, nodes: Sequence[NodeState]) -> Mapping[str, int]:
    """The policy's preference among ``nodes`` (in registration order) for one worker."""
    rank = getattr(policy, "rank", None)
    if rank is None:
        return {n.name: i for i, n in enumerate(nodes)}
    return rank(state, statement, job, res, nodes)


def place_gang(state: StateLike, job: JobState, policy: Placement,
               statement: Statement) -> tuple[WorkerAssignment, ...] | None:
    spec = job.spec
    if spec.workers == 1:
        choice = policy.choose(state, statement, job, spec.resources)
        if choice is None:
            return None
        other = keep_domains_whole(state, job, statement, choice[0],
                                   lambda nodes: node_ranks(policy, state, statement, job, spec.resources, nodes))
        if other is not None and (slots := fit(other, spec.pool, spec.resources)) is not None:
            choice = (other, slots)
        placed = (WorkerAssignment(0, choice[0].name, choice[1]),)
        statement.book(job, placed)
        return placed
    rank_key = getattr(policy, "rank_key", None)
    return place_spread(state, job, statement,
                        lambda nodes: node_ranks(policy, state, statement, job, spec.resources, nodes),
                        rank_key(state, statement, job, spec.resources) if rank_key is not None else None)
