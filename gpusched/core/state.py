"""The state one pool log folds into: nodes, their GPUs' allocations, and jobs.

Mutable on purpose: the reducer updates it in place, because copying a cluster of
thousands of nodes per event would cap replay far below the 100k events/s we need.
Only the reducer changes it for good. Policies change it tentatively, and only through a
``gpusched.policies.statement.Statement``, which records every change and undoes them
all before the state is used for the log again; services read it.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from mypy_extensions import mypyc_attr

from gpusched.core.mig import ANY_SLOT, FULL_MASK, NO_SLOT, MigProfile, allowed_slots
from gpusched.core.policy import Quota, TeamPolicy
from gpusched.core.model import (
    NO_PENDING_REASON, AttemptEnd, GpuInfo, JobPhase, JobSpec, MigMode, NodeInfo, NodeStatus, PendingReason, ServiceSpec,
    WorkerAssignment,
)

_READY = NodeStatus.READY   # bound once: EnumType.__getattr__ costs ~0.13 us a lookup on 3.11


@dataclass(slots=True)
class GpuState:
    """One GPU's allocations, and the one rule of what fits on it: placement chooses with
    these methods and ``core.capacity`` verifies placements with them.

    ``whole_ok`` and ``mig_slots`` come from the GPU's MIG mode, computed once when its node
    registers (``gpu_state``), so the checks test a flag instead of the mode: whole GPUs
    and shares need MIG off (or MIXED, a simulated GPU), a MIG slice needs its bit in
    ``mig_slots`` (``mig.slot_bit``; ANY_SLOT on a GPU that cuts slices on demand)."""

    info: GpuInfo
    healthy: bool = True
    used_milli: int = 0   # whole-GPU and shared allocations
    mig_mask: int = 0     # memory slices held by MIG instances
    used_memory_mib: int = 0   # GPU memory requested by the shares on it
    whole_ok: bool = True      # takes whole GPUs and shares (MIG mode not ENABLED)
    mig_slots: int = ANY_SLOT  # MIG slots it takes (with info.mig_capable)

    @property
    def free_milli(self) -> int:
        return 0 if self.mig_mask or not self.whole_ok else 1000 - self.used_milli

    def fits_whole(self) -> bool:
        return self.fits_share(1000)   # a whole GPU is a share of all of it

    def fits_share(self, milli: int, memory_mib: int = 0) -> bool:
        return (self.healthy and self.mig_mask == 0 and self.used_milli + milli <= 1000 and self.whole_ok
                and (memory_mib == 0 or self.used_memory_mib + memory_mib <= self.info.memory_mib))

    def takes_mig(self) -> bool:
        """Whether some MIG slice may still go here: what ``fits_mig`` needs at any start."""
        return (self.healthy and self.info.mig_capable and self.used_milli == 0 and self.mig_mask != FULL_MASK
                and self.mig_slots != NO_SLOT)

    def fits_mig(self, profile: MigProfile, start: int) -> bool:
        return (
            self.healthy and self.info.mig_capable and self.used_milli == 0
            and start in profile.starts and not self.mig_mask & profile.mask(start)
            and self.mig_slots >> (profile.compute * 8 + start) & 1 == 1   # mig.slot_bit
        )

    @property
    def mig_full(self) -> bool:
        return self.mig_mask == FULL_MASK


def gpu_state(info: GpuInfo, dynamic_mig: bool = False) -> GpuState:
    """A registered GPU's state, with the fit flags of its MIG mode."""
    gpu = GpuState(info)
    set_gpu_info(gpu, info, dynamic_mig)
    return gpu


def set_gpu_info(gpu: GpuState, info: GpuInfo, dynamic_mig: bool) -> None:
    """Take a (re-)registered inventory: the GPU's info and the flags its MIG mode sets."""
    gpu.info = info
    mode = info.mig_mode
    gpu.whole_ok = mode != MigMode.ENABLED
    if mode == MigMode.MIXED:
        gpu.mig_slots = ANY_SLOT
    elif mode == MigMode.DISABLED:
        gpu.mig_slots = NO_SLOT
    else:
        gpu.mig_slots = allowed_slots([(m.profile, m.start, m.slices) for m in info.mig_instances], dynamic_mig)


@dataclass(slots=True)
class NodeState:
    info: NodeInfo
    gpus: list[GpuState]
    status: NodeStatus = NodeStatus.READY
    used_cpu: int = 0
    used_mem: int = 0
    jobs: set[str] = field(default_factory=set)
    faults: int = 0       # GPU faults seen; repeated faults cordon the node
    cordoned: bool = False  # survives loss and re-registration until an operator clears it
    # Set when the node is declared lost: from this log time on, its agent's lease has
    # run out and the kill deadline passed, so nothing it ran can still be alive.
    fence_at: float = 0.0

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def model(self) -> str:
        return self.info.gpus[0].model if self.info.gpus else ""

    @property
    def schedulable(self) -> bool:
        return self.status is _READY

    @property
    def free_cpu(self) -> int:
        return self.info.cpu_milli - self.used_cpu

    @property
    def free_mem(self) -> int:
        return self.info.memory_mib - self.used_mem

    def free_whole_gpus(self) -> int:
        return sum(1 for g in self.gpus if g.fits_whole())


# A pending job's request as ``pending_counts`` counts it: (pool, workers, CPU milli,
# GPU milli, GPUs, GPU models, MIG profile). Typed as any tuple: mypyc keeps a fixed-length
# tuple unboxed and boxes it again (a new tuple) at each dict operation.
PendingKey = tuple[Any, ...]


def pending_key(spec: JobSpec) -> PendingKey:
    res = spec.resources
    return (spec.pool, spec.workers, res.cpu_milli, res.gpu_milli, res.gpus, res.gpu_models, res.mig_profile)


# A plain Python class even when this module is compiled (gpusched.native): the
# interpreted policies read jobs' fields in tight loops, and reading a compiled class's
# field from interpreted code costs ~14 ns instead of ~4 (the placer's cycle got 10 %
# slower with it compiled).
@mypyc_attr(native_class=False)
@dataclass(slots=True)
class JobState:
    job_id: str
    spec: JobSpec
    seq: int                       # submission order within the log
    submitted_at: float
    idempotency_key: str = ""
    phase: JobPhase = JobPhase.PENDING
    reason: str = ""
    attempt: int = 0               # bumps each time the job goes back to pending
    workers: tuple[WorkerAssignment, ...] = ()
    started: set[int] = field(default_factory=set)
    finished: dict[int, int] = field(default_factory=dict)   # worker -> exit code
    pending_since: float = 0.0     # when it (last) entered the queue
    placed_at: float = 0.0
    started_at: float = 0.0
    ended_at: float = 0.0
    restarts: int = 0              # failures charged to the job's restart budget (max_restarts)
    rule_restarts: dict[int, int] = field(default_factory=dict)   # retry rule -> failures charged to its own budget
    failures: tuple[AttemptEnd, ...] = ()   # every attempt that ended short of success, oldest first
    # Dependencies not met yet (job ids): while any is left, the job is pending but not in
    # ``ClusterState.pending``, so no policy sees it.
    waiting_for: tuple[str, ...] = ()
    # An array (``spec.array``): the submitted job is the parent, never placed itself; its
    # tasks are jobs "<parent>.<i>", released ``parallel`` at a time (the others wait for
    # the parent: ``waiting_for``). Parent: its tasks, how many were released, are queued
    # or running, ended, and did not succeed. Task: its parent and index.
    array_tasks: tuple[str, ...] = ()
    array_released: int = 0
    array_running: int = 0
    array_ended: int = 0
    array_failed: int = 0
    array_of: str = ""
    array_index: int = -1
    preemptions: int = 0
    not_before: float = 0.0        # retry back-off: do not place before this time
    checkpoint: str = ""
    checkpoint_progress_s: float = 0.0
    checkpoint_at: float = 0.0     # when the latest checkpoint was saved
    run_s: float = 0.0             # runtime accumulated over earlier attempts
    nominated_by: str = ""         # job this one is being preempted for
    # While STOPPING: what the job becomes once every worker is gone ("requeue",
    # "retry", or a terminal phase's value).
    stop_then: str = ""
    time_limit_s: float = 0.0      # max_runtime_s, or the pool's default; 0: none
    rendezvous: str = ""           # "address:port" of this attempt's rendezvous (gangs)
    # Why it waits, as the placer last wrote it (JobPendingReason), and when: shown by the
    # API, read by no decision; NO_PENDING_REASON once placed or ended.
    pending_reason: PendingReason = NO_PENDING_REASON
    pending_reason_at: float = 0.0
    # The latest JobPreempted taken for this job (kept across attempts): when, and its reason
    # ("reclaim: preempted for X"...), so preemption can hold a reclaimed job back a while.
    preempted_at: float = 0.0
    preempted_reason: str = ""
    # Its ``pending_key``, built once (at submission) for the reducer's count of pending
    # jobs; not written to snapshots (``count_pending`` builds it again where missing).
    pending_key: PendingKey | None = field(default=None, compare=False, repr=False)

    @property
    def team(self) -> str:
        return self.spec.team

    def work_at_risk(self, now: float) -> float:
        """Seconds of work lost if the job stopped now: run time since its last checkpoint."""
        if not self.started_at:
            return 0.0
        return max(0.0, now - max(self.started_at, self.checkpoint_at))

    @property
    def milli(self) -> int:
        return self.spec.total_milli


@dataclass(slots=True)
class ServiceState:
    """A service as the log made it (``core.services`` keeps its replicas as it says).
    ``desired``: the replica count asked for now (the spec's, a scale, the autoscaler's).
    ``revision``: its template's number, bumped by each change of the template;
    ``templates``: the templates of its latest revisions, for a rollback. ``replicas``:
    its live replica jobs (not ended, not being stopped) and the revision of each, in the
    order made; ``ready``: those ready to serve and the address each serves on (what
    endpoints list)."""

    spec: ServiceSpec
    created_at: float
    desired: int = 0
    revision: int = 1
    templates: dict[int, JobSpec] = field(default_factory=dict)
    replicas: dict[str, int] = field(default_factory=dict)
    ready: dict[str, str] = field(default_factory=dict)
    updated_at: float = 0.0        # when the spec or the count last changed
    rollout_at: float = 0.0        # when the current revision was applied
    scaled_reason: str = ""        # why ``desired`` has its value
    replaced: int = 0              # replicas that ended and were replaced
    # Replicas that ended on their own in a row, none ready since: their replacements
    # wait a growing back-off (Kubernetes' CrashLoopBackOff), so a template that cannot
    # serve does not fill the log with new replicas.
    crash_loop: int = 0


@dataclass(slots=True)
class Usage:
    """What a team holds right now: the basis of quota accounting and fair share."""

    gpu_milli: int = 0
    cpu_milli: int = 0
    memory_mib: int = 0
    jobs: int = 0


@dataclass(slots=True)
class TeamLedger:
    """A team's decayed usage (fair share's memory) as of log time ``at``: since then the
    team held what ``ClusterState.usage`` says, because the reducer settles the ledger
    (``capacity.settle_ledger``) right before every change of a team's usage."""

    at: float = 0.0
    gpu_milli: float = 0.0
    cpu_milli: float = 0.0
    memory_mib: float = 0.0


# Entries of ``ClusterState.changes`` kept: a placer reads them every cycle, a few
# thousand apart at most; a state nobody reads keeps this many (a few MB) at most.
CHANGES_KEPT = 1 << 17

DEFAULT_HALF_LIFE_S = 3600.0   # fair share: the half-life of the usage teams are charged for


class DedupeWindow:
    """The ids of the last ``size`` applied events, to drop duplicates on replay.

    Bounded, so state and snapshots stay small; duplicates come from producer retries,
    which land close to the original, so a window of 200k events covers them. Being a
    function of the applied sequence alone, it is deterministic across replicas."""

    __slots__ = ("size", "_ids", "_order")

    def __init__(self, size: int = 200_000) -> None:
        self.size = size
        self._ids: set[str] = set()
        self._order: deque[str] = deque()

    def seen(self, event_id: str) -> bool:
        return event_id in self._ids

    def add(self, event_id: str) -> None:
        self._ids.add(event_id)
        self._order.append(event_id)
        if len(self._order) > self.size:
            self._ids.discard(self._order.popleft())

    def admit(self, event_id: str) -> bool:
        """``add`` the id unless ``seen``; False for a duplicate. One call per event
        on the replay hot path instead of two."""
        ids = self._ids
        if event_id in ids:
            return False
        ids.add(event_id)
        order = self._order
        order.append(event_id)
        if len(order) > self.size:
            ids.discard(order.popleft())
        return True

    def ids(self) -> list[str]:
        return list(self._order)


@dataclass(slots=True)
class ClusterState:
    nodes: dict[str, NodeState] = field(default_factory=dict)
    jobs: dict[str, JobState] = field(default_factory=dict)
    pending: dict[str, None] = field(default_factory=dict)   # ordered set of job ids
    dependents: dict[str, tuple[str, ...]] = field(default_factory=dict)   # job -> jobs waiting for it to end
    # The pending jobs counted by request (``pending_key``), kept by the reducer as jobs
    # enter and leave ``pending``: FGD's task mix reads these few counts instead of every
    # pending job (``policies.placement.fgd.task_mix.raw_counts``). Not written to snapshots:
    # rebuilt from ``pending`` on restore (``recount_pending``).
    pending_counts: dict[PendingKey, int] = field(default_factory=dict)
    usage: dict[str, Usage] = field(default_factory=dict)    # team -> usage
    idempotency: dict[str, str] = field(default_factory=dict)  # team/key -> job id
    # Preemptions in flight: the job they free capacity for -> (nodes, when). The nodes:
    # its planned worker nodes, one per worker (JobPreempted.planned_nodes), or the
    # victims' nodes, sorted and distinct, from records without a plan. Schedulers keep
    # those nodes for that job until it is placed or the hold expires.
    nominations: dict[str, tuple[tuple[str, ...], float]] = field(default_factory=dict)
    # pool -> (default, max) time limit in seconds (PoolTimeLimitsSet); 0: none
    pool_limits: dict[str, tuple[float, float]] = field(default_factory=dict)
    # pool -> its topology levels, top down (PoolTopologySet); absent: core.topology's default
    pool_topology: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # Cluster policy (gpusched.core.policy): org -> quota, team -> quota, team -> policy.
    org_quotas: dict[str, Quota] = field(default_factory=dict)
    team_quotas: dict[str, Quota] = field(default_factory=dict)
    team_policies: dict[str, TeamPolicy] = field(default_factory=dict)
    policy_version: int = 0   # bumps on every policy change: schedulers rebuild their quota tree
    # Fair share's usage ledger, folded from event times (no clock), so every replica and
    # a placer that takes over order the queue alike (gpusched.policies.queueing.usage.folded_decay).
    ledger: dict[str, TeamLedger] = field(default_factory=dict)
    ledger_half_life_s: float = DEFAULT_HALF_LIFE_S
    # Pools that exist (ordered set): a node registered in it or ``PoolCreated``. Jobs for
    # any other pool are refused (gpusched.core.validation.check_known_pool).
    pools: dict[str, None] = field(default_factory=dict)
    services: dict[str, ServiceState] = field(default_factory=dict)   # name -> service
    dedupe: DedupeWindow = field(default_factory=DedupeWindow)
    applied: int = 0      # events applied (duplicates excluded)
    rejected: int = 0     # proposals found invalid when applied
    next_seq: int = 0
    offset: int = -1      # last log offset folded in (set by the log adapter)
    version: int = 0      # bumps on every change; lets schedulers skip idle cycles
    # Bumps whenever capacity may have grown (GPUs released, a node registered or
    # uncordoned, a GPU healthy again). Between two bumps capacity only shrinks, so a job
    # that did not fit still does not: schedulers park it (policies.queueing.parking).
    capacity_epoch: int = 0
    # Retention of finished jobs (``gpusched.core.retention``): a terminal job is dropped
    # once the log's clock is ``retention_s`` past its end; 0 keeps every job forever.
    # Replicas of a pool must use the same value to agree on the state.
    retention_s: float = 0.0
    clock: float = 0.0    # the latest event time applied: the log's own clock
    ended: list[str] = field(default_factory=list)   # terminal jobs in the order they ended
    ended_head: int = 0   # ended[:ended_head] are pruned already
    prune_at: float = 0.0  # clock at which the oldest of them may go; 0 when none waits
    pruned: int = 0       # jobs dropped so far
    # The jobs each accepted event changed (its ``Outcome.jobs``), in the order applied:
    # what a policy keeps beside the state between cycles (the reservation stage's index of
    # ends) reads the entries past its last position instead of comparing every job.
    # ``changes[0]`` is entry number ``changes_base``: past ``CHANGES_KEPT`` entries the older
    # half is dropped (``note_changes``), and a reader whose position is below the base
    # compares everything, as it would without this journal. Readers keep positions beside
    # this very object only, so a snapshot writes where the journal ends, not its entries:
    # a restored state's journal starts empty there (``gpusched.core.snapshot``).
    changes: list[str] = field(default_factory=list)
    changes_base: int = 0
    # The node of each change of a node by itself (added, its registration, status or a
    # GPU's health), in the order applied (``note_node``): a reader that keeps rows per
    # node refreshes those instead of rebuilding. Bounded and left out of snapshots as
    # ``changes`` is. ``nodes_registered`` counts the registrations (a node added, or its
    # inventory taken again: pool, GPUs, MIG mode), for a reader that rebuilds then.
    node_changes: list[str] = field(default_factory=list)
    node_changes_base: int = 0
    nodes_registered: int = 0

    def changes_since(self, position: int) -> list[str] | None:
        """The jobs changed from entry ``position`` on (a job may repeat), or None when
        those entries were dropped, or ``position`` is past the end (it came from another
        journal: one this state was restored from, or which went on further)."""
        if position < self.changes_base or position > self.changes_base + len(self.changes):
            return None
        return self.changes[position - self.changes_base:]

    def changes_end(self) -> int:
        """The number the next entry will get: a reader's position once it has read all."""
        return self.changes_base + len(self.changes)

    def node_changes_since(self, position: int) -> list[str] | None:
        """``changes_since`` of the journal of changed nodes (``node_changes``)."""
        if position < self.node_changes_base or position > self.node_changes_base + len(self.node_changes):
            return None
        return self.node_changes[position - self.node_changes_base:]

    def node_changes_end(self) -> int:
        return self.node_changes_base + len(self.node_changes)

    def team_usage(self, team: str) -> Usage:
        usage = self.usage.get(team)
        if usage is None:
            usage = self.usage[team] = Usage()
        return usage

    def pool_nodes(self, pool: str) -> list[NodeState]:
        return [n for n in self.nodes.values() if n.info.pool == pool]


def count_pending(state: ClusterState, job: JobState, n: int) -> None:
    """Add ``n`` (1: the job entered ``pending``, -1: it left) to its request's count."""
    counts = state.pending_counts
    key = job.pending_key
    if key is None:   # its first count (submitted), restored from a snapshot, or made by hand
        key = job.pending_key = pending_key(job.spec)
    left = counts.get(key, 0) + n
    if left:
        counts[key] = left
    else:
        del counts[key]   # a request no pending job makes is no request of the count


def recount_pending(state: ClusterState) -> None:
    """``pending_counts`` counted afresh from ``pending`` (a restored state's)."""
    state.pending_counts = {}
    jobs = state.jobs
    for job_id in state.pending:
        count_pending(state, jobs[job_id], 1)
