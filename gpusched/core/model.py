"""Value objects of the domain: what a job asks for and where its workers were put.

All frozen: they travel inside events, which are history and never change.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import Enum

from gpusched.core.mig import parse_profile


# Exit code a node-agent reports for work lost to infrastructure (agent restart, node
# loss): the job is requeued without charging its restart budget.
EXIT_LOST = -2


class JobKind(str, Enum):
    TRAINING = "training"
    INFERENCE = "inference"


class JobPhase(str, Enum):
    PENDING = "pending"
    PLACED = "placed"
    RUNNING = "running"
    PREEMPTING = "preempting"   # victims told to checkpoint, GPUs not yet free
    # The attempt is ending (cancel, failure, hang, time limit, node or GPU loss): its
    # workers are being stopped and keep their GPUs, CPU and memory until each one's real
    # end is reported (or its node is fenced). Then the job goes where ``stop_then`` says.
    STOPPING = "stopping"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMEOUT = "timeout"         # stopped at its time limit; not retried

    # Plain attributes of each member, set below. Properties here cost ~0.5 us a call on
    # Python 3.11: every ``JobPhase.X`` inside them goes through EnumType.__getattr__.
    terminal: bool
    holds_gpus: bool


for _phase in JobPhase:
    _phase.terminal = _phase.value in ("succeeded", "failed", "cancelled", "timeout")
    _phase.holds_gpus = _phase.value in ("placed", "running", "preempting", "stopping")


class MigMode(str, Enum):
    """What a GPU offers, as its node registered it.

    MIXED: whole GPUs, shares, or MIG slices created on demand (simulated GPUs; the
    default, so older events keep their meaning). DISABLED: MIG off (NVML mode 0), whole
    GPUs and shares only. ENABLED: MIG on (NVML mode 1), MIG slices only: CUDA cannot use
    a MIG-enabled GPU whole."""

    MIXED = "mixed"
    DISABLED = "disabled"
    ENABLED = "enabled"


class NodeStatus(str, Enum):
    READY = "ready"
    LOST = "lost"
    CORDONED = "cordoned"


@dataclass(frozen=True, slots=True)
class WorkerResources:
    """What one worker (gang member) needs. Exactly one GPU form is used:
    ``gpus`` whole GPUs, or one GPU shared at ``gpu_milli`` (1..999), or ``mig_profile``.
    A worker with none of them is CPU-only."""

    gpus: int = 0
    gpu_milli: int = 0
    mig_profile: str = ""
    cpu_milli: int = 0
    memory_mib: int = 0
    gpu_models: tuple[str, ...] = ()
    gpu_memory_mib: int = 0    # GPU memory a share may use (0: not limited); shares only

    @property
    def is_share(self) -> bool:
        return self.gpu_milli > 0 and self.gpus == 0

    @property
    def is_mig(self) -> bool:
        return bool(self.mig_profile)

    @property
    def milli(self) -> int:
        """GPU milli one worker accounts for (whole GPUs count 1000 each)."""
        # is_share and is_mig inlined: the reducer asks this for every booking
        if self.gpu_milli > 0 and self.gpus == 0:
            return self.gpu_milli
        if self.mig_profile:
            profile = parse_profile(self.mig_profile)
            return profile.milli if profile else 0
        return self.gpus * 1000

    def allows(self, model: str) -> bool:
        return not self.gpu_models or model in self.gpu_models


class FailureCause(str, Enum):
    """Why an attempt ended short of success (docs/guide/workloads.md, "Retries by cause")."""

    UNSPECIFIED = "unspecified"   # the API's zero value: refused in a retry rule
    EXIT = "exit"                 # the command exited non-zero
    OOM = "oom"                   # the host's out-of-memory killer ended a worker
    HANG = "hang"                 # no progress within its deadline (the supervisor's verdict)
    NODE = "node"                 # its node was lost, a GPU faulted, or its node-agent lost the worker
    PREEMPTION = "preemption"     # preempted for other work


class RetryAction(str, Enum):
    """What a failure of a rule's cause does (Kubernetes' podFailurePolicy actions)."""

    COUNT = "count"     # placed again, counted against the rule's budget (or the job's max_restarts)
    IGNORE = "ignore"   # placed again, not counted
    FAIL = "fail"       # the job fails at once


@dataclass(frozen=True, slots=True)
class RetryRule:
    """One rule of a job's retry policy: the first that matches a failure decides.
    ``exit_codes`` (cause EXIT only): the codes it matches, empty for any.
    ``max_restarts`` (COUNT only): a budget of its own; 0: the job's ``max_restarts``."""

    cause: FailureCause = FailureCause.UNSPECIFIED
    exit_codes: tuple[int, ...] = ()
    action: RetryAction = RetryAction.COUNT
    max_restarts: int = 0

    def matches(self, cause: FailureCause, exit_code: int) -> bool:
        return self.cause is cause and (not self.exit_codes or exit_code in self.exit_codes)


# What a failure no rule matches does: the job's own faults count, the cluster's do not.
DEFAULT_RETRY = {FailureCause.EXIT: RetryAction.COUNT, FailureCause.OOM: RetryAction.COUNT,
                 FailureCause.HANG: RetryAction.COUNT, FailureCause.NODE: RetryAction.IGNORE,
                 FailureCause.PREEMPTION: RetryAction.IGNORE}


@dataclass(frozen=True, slots=True)
class AttemptEnd:
    """How one attempt that did not succeed ended: its cause, the exit code where the
    command's own (0 otherwise), whether it counted against a budget, and why."""

    attempt: int
    cause: FailureCause
    exit_code: int = 0
    counted: bool = False
    reason: str = ""
    time: float = 0.0


class DependencyCondition(str, Enum):
    """What a job waits for of another (Slurm's afterok, afterany, afternotok)."""

    SUCCEEDED = "succeeded"   # it succeeded
    FINISHED = "finished"     # it ended, however
    FAILED = "failed"         # it failed or reached its time limit


@dataclass(frozen=True, slots=True)
class Dependency:
    """Start only once job ``job`` (same team, same pool) ended as ``when`` says."""

    job: str
    when: DependencyCondition = DependencyCondition.SUCCEEDED

    def met_by(self, phase: JobPhase) -> bool:
        if self.when is DependencyCondition.SUCCEEDED:
            return phase is JobPhase.SUCCEEDED
        if self.when is DependencyCondition.FAILED:
            return phase is JobPhase.FAILED or phase is JobPhase.TIMEOUT
        return phase.terminal


@dataclass(frozen=True, slots=True)
class ArraySpec:
    """``count`` tasks of one spec (Slurm's ``--array=0-N%P``), each a job of its own told
    its index (``GPUSCHED_ARRAY_INDEX``); at most ``parallel`` of them queued or running
    at once (0: all). ``count`` 0: not an array."""

    count: int = 0
    parallel: int = 0


@dataclass(frozen=True, slots=True)
class TopologySlice:
    """Every ``workers`` consecutive workers of a gang (0..w-1, w..2w-1, ...) inside one
    domain of ``level`` (Kueue's ``podset-slice-size``); ``level`` "": no slices."""

    level: str = ""
    workers: int = 0


@dataclass(frozen=True, slots=True)
class TopologyRequest:
    """Where a gang's workers may go in its pool's topology, named by the pool's levels
    (``PoolTopologySet``; docs/guide/workloads.md, "Topology"). ``required``: all workers
    inside one domain of that level, or the job waits; ``preferred``: the fewest domains of
    that level first (every gang is kept compact at every level; this puts one level
    first); ``slice``: see ``TopologySlice``. All "": today's compact placement."""

    required: str = ""
    preferred: str = ""
    slice: TopologySlice = field(default_factory=TopologySlice)


@dataclass(frozen=True, slots=True)
class Readiness:
    """How a service's replica is found ready to serve, checked by its node-agent every
    ``period_s`` on worker 0: an HTTP GET of ``http_path`` on the port the agent gave it
    (``PORT``) answering 2xx or 3xx, or ``command`` exiting 0 (as Kubernetes' readiness
    probe). Ready after ``success_threshold`` passes in a row, not ready after
    ``failure_threshold`` failures in a row. Neither set: ready once it runs. Zeros
    (what a record without the field holds) mean the defaults: every 1 s, a 1 s timeout,
    1 pass, 3 failures."""

    http_path: str = ""
    command: tuple[str, ...] = ()
    period_s: float = 0.0
    timeout_s: float = 0.0
    initial_delay_s: float = 0.0
    success_threshold: int = 0
    failure_threshold: int = 0

    @property
    def checked(self) -> bool:
        return bool(self.http_path or self.command)

    @property
    def every_s(self) -> float:
        return self.period_s or 1.0

    @property
    def within_s(self) -> float:
        return self.timeout_s or 1.0

    @property
    def passes(self) -> int:
        return self.success_threshold or 1

    @property
    def failures(self) -> int:
        return self.failure_threshold or 3


@dataclass(frozen=True, slots=True)
class JobSpec:
    name: str
    team: str
    pool: str = "default"
    priority_class: str = "training"
    kind: JobKind = JobKind.TRAINING
    workers: int = 1
    resources: WorkerResources = field(default_factory=WorkerResources)
    max_runtime_s: float = 0.0
    preemptible: bool = True
    checkpoint_interval_s: float = 0.0
    command: tuple[str, ...] = ()
    simulated_duration_s: float = 0.0
    org: str = ""
    max_restarts: int = 3
    retry: tuple[RetryRule, ...] = ()   # by cause; the first matching rule decides
    depends_on: tuple[Dependency, ...] = ()   # jobs to wait for before it may be placed
    array: ArraySpec = field(default_factory=ArraySpec)
    # A service's replica (``ServiceSpec``): the service it belongs to; each worker is
    # given a free port in ``PORT`` when ``serve_port``, worker 0's being the endpoint;
    # the node-agent reports it ready by ``readiness``.
    service: str = ""
    serve_port: bool = False
    readiness: Readiness = field(default_factory=Readiness)
    topology: TopologyRequest = field(default_factory=TopologyRequest)

    def retry_rule(self, cause: FailureCause, exit_code: int = 0) -> tuple[int, RetryAction]:
        """(index of the rule that decides, -1 for the default; its action)."""
        for i, rule in enumerate(self.retry):
            if rule.matches(cause, exit_code):
                return i, rule.action
        return -1, DEFAULT_RETRY[cause]

    @property
    def total_milli(self) -> int:
        return self.workers * self.resources.milli


@dataclass(frozen=True, slots=True)
class UpdateStrategy:
    """How a changed template replaces a service's replicas (a Deployment's rolling
    update): at most ``max_surge`` replicas above the desired count, and at most
    ``max_unavailable`` of the desired count not ready, at any time."""

    max_surge: int = 1
    max_unavailable: int = 0


class ScalingMetric(str, Enum):
    """What a service's replica count follows (docs/guide/inference.md, "Autoscaling")."""

    NONE = "none"
    REQUESTS_IN_FLIGHT = "requests_in_flight"     # per replica, as the replicas report it
    REQUESTS_PER_SECOND = "requests_per_second"   # per replica
    GPU_UTILIZATION = "gpu_utilization"           # percent, from the node-agents' usage records


@dataclass(frozen=True, slots=True)
class Autoscaling:
    """The HorizontalPodAutoscaler's rule: desired = ceil(replicas x metric / target),
    unchanged within ``tolerance`` of the target, never below the highest
    recommendation of the last ``scale_down_window_s``, at most ``max_scale_up`` more
    replicas a minute; to zero after ``scale_to_zero_after_s`` without a request (0:
    never), back to one on the first."""

    metric: ScalingMetric = ScalingMetric.NONE
    target: float = 0.0
    tolerance: float = 0.1
    scale_down_window_s: float = 300.0
    max_scale_up: int = 4
    scale_to_zero_after_s: float = 0.0


@dataclass(frozen=True, slots=True)
class ServiceSpec:
    """A long-running service: ``replicas`` copies of ``template`` (its name, team, pool
    and priority class are the service's), each placed and replaced on its own, each a
    gang of ``template.workers`` (leader first) where a model spans nodes. ``min_replicas``
    and ``max_replicas`` (0: no bound) bound scaling and preemption."""

    name: str
    team: str
    template: JobSpec
    pool: str = "default"
    priority_class: str = "production-inference"
    preemptible: bool = False
    replicas: int = 1
    min_replicas: int = 1
    max_replicas: int = 0
    update: UpdateStrategy = field(default_factory=UpdateStrategy)
    autoscaling: Autoscaling = field(default_factory=Autoscaling)
    org: str = ""

    def replica_spec(self) -> JobSpec:
        """The spec each replica of the current template runs with."""
        return replace(self.template, name=self.name, team=self.team, pool=self.pool,
                       priority_class=self.priority_class, preemptible=self.preemptible,
                       kind=JobKind.INFERENCE, service=self.name, org=self.org,
                       array=ArraySpec(), depends_on=())


@dataclass(frozen=True, slots=True)
class GpuSlot:
    """One GPU (or part of one) given to a worker."""

    index: int
    milli: int = 1000
    mig_profile: str = ""
    mig_start: int = 0


@dataclass(frozen=True, slots=True)
class WorkerAssignment:
    worker: int
    node: str
    gpus: tuple[GpuSlot, ...] = ()


@dataclass(frozen=True, slots=True)
class MigInstance:
    """A MIG GPU instance (with its one compute instance) as NVML reports it."""

    profile: str          # NVML's profile name, e.g. "1g.10gb", "3g.71gb"
    start: int            # first memory slice (NVML placement start)
    uuid: str             # "MIG-...": what CUDA_VISIBLE_DEVICES names
    memory_mib: int = 0
    slices: int = 0       # memory slices covered (NVML placement size)
    profile_id: int = 0   # NVML GPU instance profile id
    gi_id: int = 0        # NVML GPU instance id
    ci_id: int = 0        # NVML compute instance id


@dataclass(frozen=True, slots=True)
class MigProfileInfo:
    """One GPU instance profile a GPU supports, from NVML's profile info."""

    name: str             # "1g.10gb"
    profile_id: int
    compute: int          # compute slices (NVML sliceCount)
    memory_mib: int       # NVML memorySizeMB
    instances: int = 0    # how many fit on an empty GPU (NVML instanceCount)


@dataclass(frozen=True, slots=True)
class GpuInfo:
    index: int
    uuid: str
    model: str
    memory_mib: int
    mig_capable: bool = False
    mig_mode: MigMode = MigMode.MIXED
    mig_instances: tuple[MigInstance, ...] = ()   # existing instances (MIG enabled)
    mig_profiles: tuple[MigProfileInfo, ...] = ()  # the profiles NVML offers (MIG enabled)


@dataclass(frozen=True, slots=True)
class NodeInfo:
    name: str
    pool: str
    cpu_milli: int
    memory_mib: int
    gpus: tuple[GpuInfo, ...] = ()
    labels: tuple[tuple[str, str], ...] = ()   # e.g. (("rack", "r1"), ("spine", "s0"))
    simulated: bool = False
    agent_id: str = ""                            # incarnation of the agent process
    # Where peers reach this node's workers (a gang's MASTER_ADDR), and the fencing
    # contract of its agent: a worker outlives the agent's last renewed lease by at
    # most ``lease_s + kill_wait_s`` (docs/guide/workloads.md). 0: nothing runs under a lease
    # (simulated runs), so a lost node's work is gone when it is declared lost.
    address: str = ""
    lease_s: float = 0.0
    kill_wait_s: float = 0.0
    dynamic_mig: bool = False   # the agent creates and destroys MIG instances to fit slots
    mps: bool = False           # the CUDA MPS daemon runs: shares get MPS limits

    def label(self, key: str, default: str = "") -> str:
        for k, v in self.labels:
            if k == key:
                return v
        return default


class PendingKind(str, Enum):
    """Why a pending job was not placed in the placer's last look at it (docs/guide/why-pending.md).
    NONE: no reason known yet (the placer has not looked, or the job is not pending)."""

    NONE = "none"
    BACKOFF = "backoff"          # retry back-off: not before ``JobState.not_before``
    QUOTA = "quota"              # its team or org would go over its limit
    RESERVATION = "reservation"  # it fits, but an EASY-backfill reservation holds that capacity
    NOMINATION = "nomination"    # it fits, but nodes freed by a preemption are kept for its beneficiary
    NO_FIT = "no_fit"            # no node takes a worker (``counts``: each node's first failing filter)
    GANG = "gang"                # nodes take some workers, not the whole gang
    QUEUED = "queued"            # it fits now: it waits for its turn in a cycle
    GUARANTEE = "guarantee"      # it would borrow what teams waiting below their guarantee keep back
    TOPOLOGY = "topology"        # the nodes take the gang, but no domain its topology request asks for does


@dataclass(frozen=True, slots=True)
class NodeCount:
    """How many nodes one placement filter rejected (or, as ``"fits"``, took a worker)."""

    filter: str
    nodes: int


@dataclass(frozen=True, slots=True)
class PendingReason:
    """The placer's summary of why a job waits, like kube-scheduler's "0/12 nodes are
    available: 8 Insufficient nvidia.com/gpu, 4 node(s) were cordoned". Written by the
    placer (``JobPendingReason``), shown by the API; it decides nothing."""

    kind: PendingKind = PendingKind.NONE
    summary: str = ""
    nodes: int = 0                          # nodes of the job's pool looked at
    counts: tuple[NodeCount, ...] = ()      # per filter, the nodes it rejected first


NO_PENDING_REASON = PendingReason()
