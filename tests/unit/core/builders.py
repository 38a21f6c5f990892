"""Small builders shared by the core unit tests: nodes, specs and a log harness."""
from __future__ import annotations

from gpusched.core import events as ev
from gpusched.core.catalog import CATALOG
from gpusched.core.mig import PROFILES
from gpusched.core.model import (
    GpuInfo, GpuSlot, JobKind, JobSpec, NodeInfo, WorkerAssignment, WorkerResources,
)
from gpusched.core.reducer import Outcome, apply
from gpusched.core.state import ClusterState, JobState, NodeState


def make_node(name: str, gpus: int = 4, model: str = "H100-80GB", pool: str = "default",
              cpu: int = 16_000, mem: int = 64_000, agent: str = "a1", lease: float = 0.0,
              kill_wait: float = 0.0) -> NodeInfo:
    cat = CATALOG[model]
    return NodeInfo(
        name=name, pool=pool, cpu_milli=cpu, memory_mib=mem,
        gpus=tuple(GpuInfo(i, f"GPU-{name}-{i}", model, cat.memory_mib, cat.mig_capable)
                   for i in range(gpus)),
        agent_id=agent, lease_s=lease, kill_wait_s=kill_wait,
    )


def make_spec(team: str = "team-a", *, workers: int = 1, gpus: int = 0, milli: int = 0,
              mig: str = "", cpu: int = 1000, mem: int = 1000, models: tuple[str, ...] = (),
              pool: str = "default", preemptible: bool = True, max_restarts: int = 3,
              name: str = "job", priority_class: str = "training",
              kind: JobKind = JobKind.TRAINING) -> JobSpec:
    if not (gpus or milli or mig):
        gpus = 1
    return JobSpec(
        name=name, team=team, pool=pool, priority_class=priority_class, kind=kind, workers=workers,
        resources=WorkerResources(gpus=gpus, gpu_milli=milli, mig_profile=mig,
                                  cpu_milli=cpu, memory_mib=mem, gpu_models=models),
        preemptible=preemptible, max_restarts=max_restarts,
    )


def whole(*indexes: int) -> tuple[GpuSlot, ...]:
    return tuple(GpuSlot(i) for i in indexes)


def share(index: int, milli: int) -> tuple[GpuSlot, ...]:
    return (GpuSlot(index, milli),)


def mig(index: int, profile: str, start: int) -> tuple[GpuSlot, ...]:
    from gpusched.core.mig import parse_profile

    return (GpuSlot(index, parse_profile(profile).milli, profile, start),)


def workers(*placements: tuple[str, tuple[GpuSlot, ...]]) -> tuple[WorkerAssignment, ...]:
    """workers(("n1", whole(0)), ("n2", whole(1))) -> worker 0 on n1, worker 1 on n2."""
    return tuple(WorkerAssignment(i, node, slots) for i, (node, slots) in enumerate(placements))


class Log:
    """Applies events to one ClusterState with fresh ids and an advancing clock."""

    def __init__(self, *nodes: NodeInfo, retention_s: float = 0.0) -> None:
        self.state = ClusterState(retention_s=retention_s)
        # The default pool exists, as if an operator had created it: jobs for a pool that
        # does not exist are refused (PoolCreated and NodeRegistered make pools exist).
        self.state.pools["default"] = None
        self.n = 0
        self.now = 0.0
        self.events: list[ev.Event] = []
        for info in nodes:
            assert self(ev.NodeRegistered, node=info).accepted

    def __call__(self, cls: type[ev.Event], **kw) -> Outcome:
        self.n += 1
        self.now += 1.0
        kw.setdefault("event_id", f"e{self.n}")
        kw.setdefault("time", self.now)
        event = cls(**kw)
        self.events.append(event)
        return apply(self.state, event)

    def replay(self, event: ev.Event) -> Outcome:
        self.events.append(event)
        return apply(self.state, event)

    # --- conveniences ---------------------------------------------------------------
    def job(self, job_id: str) -> JobState:
        return self.state.jobs[job_id]

    def node(self, name: str) -> NodeState:
        return self.state.nodes[name]

    def submit(self, job_id: str, spec: JobSpec | None = None, key: str = "", **spec_kw) -> Outcome:
        return self(ev.JobSubmitted, job_id=job_id, spec=spec or make_spec(**spec_kw), idempotency_key=key)

    def place(self, job_id: str, *placements, attempt: int | None = None) -> Outcome:
        if attempt is None:
            attempt = self.job(job_id).attempt if job_id in self.state.jobs else 0
        return self(ev.JobPlaced, job_id=job_id, attempt=attempt, workers=workers(*placements))

    def start_all(self, job_id: str) -> None:
        job = self.job(job_id)
        for w in job.workers:
            assert self(ev.WorkerStarted, job_id=job_id, attempt=job.attempt, worker=w.worker, node=w.node).accepted

    def finish(self, job_id: str, worker: int, code: int, attempt: int | None = None) -> Outcome:
        job = self.job(job_id)
        node = next((w.node for w in job.workers if w.worker == worker), "nowhere")
        return self(ev.WorkerFinished, job_id=job_id, attempt=job.attempt if attempt is None else attempt,
                    worker=worker, node=node, exit_code=code)

    def stopped(self, job_id: str, code: int = 143, signal: int = 15) -> None:
        """Every unfinished worker of the current attempt reports its end, as agents do
        once they stopped it (docs/guide/workloads.md: resources are held until then)."""
        job = self.job(job_id)
        attempt = job.attempt
        for w in [w for w in job.workers if w.worker not in job.finished]:
            out = self(ev.WorkerFinished, job_id=job_id, attempt=attempt, worker=w.worker, node=w.node,
                       exit_code=code, signal=signal)
            assert out.accepted, out.reason

    def run(self, job_id: str, *placements) -> None:
        """Submit-less: place and start every worker of an existing pending job."""
        out = self.place(job_id, *placements)
        assert out.accepted, out.reason
        self.start_all(job_id)


def capacity_snapshot(state: ClusterState) -> tuple:
    """Every booked counter of the state, to compare before/after a rejected event."""
    nodes = tuple(
        (name, n.status, n.used_cpu, n.used_mem, tuple(sorted(n.jobs)),
         tuple((g.healthy, g.used_milli, g.mig_mask) for g in n.gpus))
        for name, n in sorted(state.nodes.items())
    )
    usage = tuple(sorted((t, u.gpu_milli, u.cpu_milli, u.memory_mib, u.jobs)
                         for t, u in state.usage.items()
                         if u.gpu_milli or u.cpu_milli or u.memory_mib or u.jobs))
    return nodes, usage


def _sample_state() -> ClusterState:
    """A small state through the reducer with every kind of booking."""
    state = ClusterState()
    h100 = CATALOG["H100-80GB"]
    info = NodeInfo("n1", "default", 64_000, 512_000,
                    tuple(GpuInfo(i, f"GPU-{i}", "H100-80GB", h100.memory_mib, True) for i in range(4)),
                    (("rack", "r1"),), False, "a1")
    t = 1.0

    def do(cls, **kw):
        nonlocal t
        t += 1
        out = apply(state, cls(event_id=f"e{t}", time=t, **kw))
        assert out.accepted, out.reason

    do(ev.NodeRegistered, node=info)
    shapes = [WorkerResources(gpus=2, cpu_milli=100), WorkerResources(gpu_milli=250),
              WorkerResources(mig_profile="3g")]
    slots = [(GpuSlot(0), GpuSlot(1)), (GpuSlot(2, 250),), (GpuSlot(3, PROFILES["3g"].milli, "3g", 4),)]
    for i, (res, s) in enumerate(zip(shapes, slots)):
        do(ev.JobSubmitted, job_id=f"j{i}", spec=JobSpec(f"j{i}", "t1", resources=res), idempotency_key=f"k{i}")
        do(ev.JobPlaced, job_id=f"j{i}", attempt=0, workers=(WorkerAssignment(0, "n1", s),))
        do(ev.WorkerStarted, job_id=f"j{i}", attempt=0, worker=0, node="n1")
    do(ev.JobSubmitted, job_id="vip", spec=JobSpec("vip", "t2", resources=WorkerResources(gpus=4)))
    do(ev.JobPreempted, job_id="j0", attempt=0, for_job="vip")
    do(ev.WorkerFinished, job_id="j1", attempt=0, worker=0, node="n1", exit_code=0)
    state.offset = 41
    return state
