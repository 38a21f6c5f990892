"""Supervision verdicts: which nodes are lost and which attempts hang. Pure: the caller
passes the clock and what it heard from the heartbeats topic."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from gpusched.core.model import JobPhase, NodeStatus
from gpusched.core.state import ClusterState


@dataclass(frozen=True, slots=True)
class SupervisionConfig:
    heartbeat_timeout_s: float = 10.0
    # An attempt with checkpoints on is hung when no checkpoint came for this many
    # intervals (plus a start-up grace): it is restarted, charged to its budget.
    hang_intervals: float = 3.0
    hang_grace_s: float = 30.0


# Past a node's lease before it may be declared lost: its shims' poll and the clocks'
# disagreement (the margin ``fence_at`` allows too; docs/guide/workloads.md, "Fencing").
LEASE_MARGIN_S = 1.0


def silence_allowed(node_lease_s: float, config: SupervisionConfig) -> float:
    """How long a node may be silent before it is lost: the heartbeat timeout, and never
    less than its lease and the margin. So the lease has run out when the node is declared
    lost, and the agent, which never renews a lease that ran out while work may still run
    under it, cannot keep a worker going past ``fence_at`` by a heartbeat after that."""
    return max(config.heartbeat_timeout_s, node_lease_s + LEASE_MARGIN_S if node_lease_s > 0 else 0.0)


def lost_nodes(state: ClusterState, last_seen: Mapping[str, float], since: float, now: float,
               config: SupervisionConfig) -> list[tuple[str, str]]:
    """(node, reason) for nodes whose heartbeats stopped (``silence_allowed``). ``since``:
    when we started listening — a node never heard from gets that long before it is
    declared lost."""
    lost = []
    for name, node in sorted(state.nodes.items()):
        if node.status is NodeStatus.LOST:
            continue
        seen = max(last_seen.get(name, since), since)
        allowed = silence_allowed(node.info.lease_s, config)
        if now - seen > allowed:
            lost.append((name, f"no heartbeat for {now - seen:.1f}s (timeout {allowed:g}s)"))
    return lost


def nodes_to_fence(state: ClusterState, now: float) -> list[str]:
    """Lost nodes still holding work whose fence time has come: their agents' leases ran
    out and the kill deadline passed, so their workers are certainly gone."""
    return [name for name, node in sorted(state.nodes.items())
            if node.status is NodeStatus.LOST and node.jobs and now >= node.fence_at]


def timed_out_attempts(state: ClusterState, now: float) -> list[tuple[str, int, str]]:
    """(job, attempt, reason) for attempts past their time limit (Slurm's TIMEOUT). The
    limit counts from the attempt's start (from its placement while it never started)."""
    out = []
    for job in state.jobs.values():
        limit = job.time_limit_s
        if limit <= 0 or job.phase not in _LIMITED:
            continue
        began = job.started_at or job.placed_at
        if now >= began + limit:
            out.append((job.job_id, job.attempt, f"time limit of {limit:g}s reached"))
    return out


_LIMITED = (JobPhase.PLACED, JobPhase.RUNNING, JobPhase.PREEMPTING)


def hung_attempts(state: ClusterState, now: float, config: SupervisionConfig) -> list[tuple[str, int, str]]:
    """(job, attempt, reason) for running attempts that stopped reporting progress."""
    hung = []
    for job in state.jobs.values():
        interval = job.spec.checkpoint_interval_s
        if job.phase is not JobPhase.RUNNING or interval <= 0:
            continue
        last = max(job.started_at, job.checkpoint_at)
        deadline = last + config.hang_intervals * interval + config.hang_grace_s
        if now > deadline:
            hung.append((job.job_id, job.attempt, f"hung: no progress report for {now - last:.0f}s"))
    return hung
