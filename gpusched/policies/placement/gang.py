"""Placement: choose nodes and GPUs for every worker of a gang, or nothing.

A placement policy (``Placement``) chooses the node and GPUs of one worker; policies are
listed by name in ``registry.PLACEMENTS`` and chosen by configuration.
``place_gang`` places a one-worker job with the policy, and a gang with the topology planner
(``topology``: fewest racks, then fewest nodes), booking each worker so the
next sees it and giving up the whole gang if any worker does not fit (all-or-nothing).

Every policy breaks ties by node registration order (the order of ``state.nodes``), so a
decision is a pure function of the state. The policies themselves live in
``heuristics`` (indexed best-fit, the FGD paper's baselines) and
``fragmentation`` (FGD, and ``fgd-lookahead``: ours).
"""
from __future__ import annotations

from typing import Protocol

from gpusched.core.model import GpuSlot, WorkerAssignment, WorkerResources
from gpusched.core.state import JobState, NodeState
from gpusched.policies.statement import Statement
from gpusched.policies.gpu_fit import StateLike
from gpusched.policies.placement.topology import place_spread

Choice = tuple[NodeState, tuple[GpuSlot, ...]]


class Placement(Protocol):
    name: str

    def choose(self, state: StateLike, statement: Statement, job: JobState,
               res: WorkerResources) -> Choice | None:
        """Where one worker of ``job`` (needing ``res``) goes now, or None if nowhere."""


def place_gang(state: StateLike, job: JobState, policy: Placement,
               statement: Statement) -> tuple[WorkerAssignment, ...] | None:
    spec = job.spec
    if spec.workers == 1:
        choice = policy.choose(state, statement, job, spec.resources)
        if choice is None:
            return None
        placed = (WorkerAssignment(0, choice[0].name, choice[1]),)
        statement.book(job, placed)
        return placed
    return place_spread(state, job, statement)
