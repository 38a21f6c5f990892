"""The pool workload of the replay benchmarks (``replay_bench.py``, ``fold_bench.py``,
``trace_fold_bench.py``, ``agent_view_bench.py``), generated in memory: node
registrations, submissions (whole GPUs, shares, MIG slices, 2-node gangs), valid
``JobPlaced`` proposals (first fit, synthesised here; a few stale ones are rejected by the
reducer, as in real logs), worker starts, checkpoints, successes, failures with retries,
cancellations, GPU faults and node loss/re-registration, so the state keeps thousands of
nodes and jobs live. Every event is folded through the reducer while generating, so the
log is one the services could have written.
"""
from __future__ import annotations

import random
import secrets
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpusched.adapters.log.snapshots import capture_state, encode_state  # noqa: E402
from gpusched.core import events as ev  # noqa: E402
from gpusched.core.catalog import CATALOG  # noqa: E402
from gpusched.core.mig import PROFILES  # noqa: E402
from gpusched.core.model import GpuInfo, GpuSlot, JobKind, JobSpec, NodeInfo, WorkerAssignment, WorkerResources  # noqa: E402
from gpusched.core.reducer import apply  # noqa: E402
from gpusched.core.state import ClusterState  # noqa: E402

POOL = "default"
NODE_MODELS = ("H100-80GB", "H100-80GB", "A100-80GB", "L40S-48GB")
TEAMS = ("vision", "speech", "llm", "ads", "search", "robotics")


class _Full(Exception):
    """The log has its events."""


class PoolSim:
    """Drives one pool: every event it emits is applied to ``self.state`` at once."""

    def __init__(self, seed: int, nodes: int, retention_s: float = 0.0) -> None:
        self.rng = random.Random(seed)
        self.state = ClusterState()
        self.retention_s = retention_s   # recorded as the log's first event, as admission does
        self.now = 1_700_000_000.0
        self.jobs = 0
        self.events: list[ev.Event] = []
        self.accepted = 0
        self.node_names = [f"node-{i:05d}" for i in range(nodes)]
        self.agents = {n: f"node-agent-{secrets.token_hex(4)}" for n in self.node_names}
        self.placer = f"placer-{secrets.token_hex(4)}"
        self.admission = f"admission-{secrets.token_hex(4)}"
        self.running: list[str] = []      # jobs with workers placed (maybe started)
        self.lost: list[str] = []         # nodes lost, to come back later
        self.steps = 40                   # progress steps per round: fewer than arrivals need, so work piles up
        self.limit = 0
        self.snap: bytes | None = None

    def _id(self) -> str:
        return "%032x" % self.rng.getrandbits(128)   # like uuid4().hex

    def emit(self, cls, producer: str, **kw) -> bool:
        if len(self.events) >= self.limit:
            raise _Full
        self.now += self.rng.expovariate(50.0)
        e = cls(event_id=self._id(), time=self.now, producer=producer, **kw)
        self.events.append(e)
        out = apply(self.state, e)
        self.accepted += out.accepted
        return out.accepted

    # -- nodes --
    def node_info(self, name: str) -> NodeInfo:
        model = NODE_MODELS[int(name.rsplit("-", 1)[1]) % len(NODE_MODELS)]
        cat = CATALOG[model]
        return NodeInfo(
            name=name, pool=POOL, cpu_milli=192_000, memory_mib=2_048_000,
            gpus=tuple(GpuInfo(i, f"GPU-{name}-{i}-{secrets.token_hex(6)}", model, cat.memory_mib, cat.mig_capable)
                       for i in range(8)),
            labels=(("rack", f"r{int(name[-5:]) // 32}"), ("zone", "z1")), agent_id=self.agents[name],
        )

    def register_all(self) -> None:
        for name in self.node_names:
            self.emit(ev.NodeRegistered, self.agents[name], node=self.node_info(name))

    # -- jobs --
    def spec(self, i: int) -> JobSpec:
        r = self.rng.random()
        team = self.rng.choice(TEAMS)
        if r < 0.50:
            res, workers, kind, name = WorkerResources(gpus=self.rng.choice([1, 1, 2, 4, 8]), cpu_milli=8000,
                                                       memory_mib=64_000), 1, JobKind.TRAINING, f"train-{i}"
        elif r < 0.75:
            res, workers, kind, name = WorkerResources(gpu_milli=self.rng.choice([100, 250, 500]), cpu_milli=2000,
                                                       memory_mib=16_000), 1, JobKind.INFERENCE, f"infer-{i}"
        elif r < 0.90:
            res, workers, kind, name = WorkerResources(mig_profile=self.rng.choice(["1g", "2g", "3g"]), cpu_milli=2000,
                                                       memory_mib=16_000), 1, JobKind.INFERENCE, f"mig-{i}"
        else:
            res, workers, kind, name = WorkerResources(gpus=8, cpu_milli=64_000, memory_mib=512_000), 2, \
                JobKind.TRAINING, f"gang-{i}"
        return JobSpec(name=name, team=team, pool=POOL, kind=kind, workers=workers, resources=res,
                       priority_class=self.rng.choice(["training", "training", "production-inference"]),
                       checkpoint_interval_s=600.0, command=("python", "-m", "train", f"--run={i}"),
                       simulated_duration_s=round(self.rng.uniform(30, 3600), 1), org="org-1")

    def submit(self) -> None:
        self.jobs += 1
        self.emit(ev.JobSubmitted, self.admission, job_id=f"job-{self.jobs:08d}", spec=self.spec(self.jobs),
                  idempotency_key=f"key-{self.jobs}" if self.rng.random() < 0.3 else "")

    def _slots(self, node, res: WorkerResources, taken: set[int]) -> tuple[GpuSlot, ...] | None:
        gpus = node.gpus
        if res.mig_profile:
            p = PROFILES[res.mig_profile]
            for i, g in enumerate(gpus):
                if i not in taken and g.info.mig_capable:
                    for s in p.starts:
                        if g.fits_mig(p, s):
                            return (GpuSlot(i, p.milli, res.mig_profile, s),)
            return None
        if res.gpu_milli:
            for i, g in enumerate(gpus):
                if i not in taken and g.fits_share(res.gpu_milli):
                    return (GpuSlot(i, res.gpu_milli),)
            return None
        free = [i for i, g in enumerate(gpus) if i not in taken and g.fits_whole()]
        return tuple(GpuSlot(i) for i in free[:res.gpus]) if len(free) >= res.gpus else None

    def place_some(self, limit: int) -> None:
        """First fit from random nodes for the oldest pending jobs (a cheap stand-in for
        the Scheduler over thousands of nodes; the reducer checks every proposal)."""
        st = self.state
        for job_id in list(st.pending)[:limit]:
            job = st.jobs[job_id]
            res = job.spec.resources
            workers = []
            for w in range(job.spec.workers):
                for _ in range(12):
                    node = st.nodes[self.rng.choice(self.node_names)]
                    if not node.schedulable or node.free_cpu < res.cpu_milli or node.free_mem < res.memory_mib \
                            or any(x.node == node.name for x in workers):
                        continue
                    slots = self._slots(node, res, set())
                    if slots is not None:
                        workers.append(WorkerAssignment(w, node.name, slots))
                        break
                else:
                    break
            if len(workers) == job.spec.workers:
                if self.emit(ev.JobPlaced, self.placer, job_id=job_id, attempt=job.attempt, workers=tuple(workers),
                             policy="first-fit"):
                    self.running.append(job_id)
                if self.rng.random() < 0.01:   # a zombie placer's stale duplicate proposal: rejected
                    self.emit(ev.JobPlaced, "placer-zombie", job_id=job_id, attempt=job.attempt,
                              workers=tuple(workers), policy="first-fit")

    def progress(self) -> None:
        """One step of a random running job: start its workers, checkpoint, finish."""
        if not self.running:
            return
        k = self.rng.randrange(len(self.running))
        job_id = self.running[k]
        job = self.state.jobs[job_id]
        if not job.phase.holds_gpus:
            self.running[k] = self.running[-1]
            self.running.pop()
            return
        agent = self.agents[job.workers[0].node]
        unstarted = [w for w in job.workers if w.worker not in job.started]
        if unstarted:
            w = unstarted[0]
            self.emit(ev.WorkerStarted, self.agents[w.node], job_id=job_id, attempt=job.attempt, worker=w.worker,
                      node=w.node)
            return
        r = self.rng.random()
        if r < 0.25:
            self.emit(ev.CheckpointSaved, agent, job_id=job_id, attempt=job.attempt,
                      checkpoint=f"s3://ckpt/{job_id}/{job.attempt}/{int(self.now)}",
                      progress_s=round(self.now - job.started_at, 3))
            return
        code = 0 if r < 0.93 else self.rng.choice([1, 137])
        for w in job.workers:
            if w.worker not in job.finished and job.phase.holds_gpus:
                self.emit(ev.WorkerFinished, self.agents[w.node], job_id=job_id, attempt=job.attempt,
                          worker=w.worker, node=w.node, exit_code=code, reason="" if code == 0 else "exit")
                if code:
                    break

    def chaos(self) -> None:
        r = self.rng.random()
        if r < 0.4 and self.state.pending:
            job_id = self.rng.choice(list(self.state.pending)[:200])
            self.emit(ev.JobCancelled, self.admission, job_id=job_id, reason="user cancelled")
        elif r < 0.7:
            name = self.rng.choice(self.node_names)
            node = self.state.nodes[name]
            i = self.rng.randrange(8)
            self.emit(ev.GpuHealthChanged, self.agents[name], node=name, gpu_index=i,
                      healthy=not node.gpus[i].healthy, reason="xid 79", xid=79)
        elif r < 0.85:
            name = self.rng.choice(self.node_names)
            if self.emit(ev.NodeLost, "preemptor-1", node=name, reason="heartbeat timeout"):
                self.lost.append(name)
        elif self.lost:
            name = self.lost.pop(0)
            self.agents[name] = f"node-agent-{secrets.token_hex(4)}"
            self.emit(ev.NodeRegistered, self.agents[name], node=self.node_info(name))
        cordoned = [n for n in self.node_names[:64] if self.state.nodes[n].status.value == "cordoned"]
        if cordoned and self.rng.random() < 0.3:
            self.emit(ev.NodeUncordoned, "operator", node=cordoned[0])

    def run(self, total: int, backlog: int = 3000, snapshot_at: int | None = None):
        """Emit exactly ``total`` events; returns the snapshot bytes taken once ``snapshot_at``
        events were emitted (the state at that log offset), if asked."""
        self.limit = total
        try:
            self._run(backlog, snapshot_at)
        except _Full:
            pass
        self.state.offset = len(self.events) - 1
        return self.snap

    def _run(self, backlog: int, snapshot_at: int | None) -> None:
        self.snap = None
        if self.retention_s:
            self.emit(ev.JobRetentionSet, self.admission, job_retention_s=self.retention_s)
        self.register_all()
        while True:
            if len(self.state.pending) < backlog:
                for _ in range(20):
                    self.submit()
            self.place_some(40)
            for _ in range(self.steps):
                self.progress()
            if self.rng.random() < 0.3:
                self.chaos()
            if self.snap is None and snapshot_at is not None and len(self.events) >= snapshot_at:
                self.state.offset = len(self.events) - 1   # one partition of a fresh topic: offset = index
                self.snap = encode_state(capture_state(self.state))


def mix(events: list[ev.Event]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for e in events:
        counts[type(e).__name__] = counts.get(type(e).__name__, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))
