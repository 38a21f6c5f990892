"""Random clusters and random histories for the core property tests: ``Rnd`` (integer
choices drawn from cached strategies), ``cluster`` (random nodes), ``History`` (a log
being written and the state folded from it) and the actions (``act_*``, ``ACTIONS``)
that append valid, stale, adversarial and duplicated events to it."""
from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from gpusched.core import events as ev
from gpusched.core.digest import digest
from gpusched.core.mig import PROFILES, parse_profile
from gpusched.core.model import (
    EXIT_LOST, GpuSlot, JobPhase, JobSpec, NodeInfo, NodeStatus, TopologyRequest, TopologySlice, WorkerAssignment,
    WorkerResources,
)
from gpusched.core.priority import PRIORITY_CLASSES
from gpusched.core.reducer import apply
from gpusched.core.state import ClusterState
from gpusched.policies.memory import CycleMemory
from gpusched.policies.placement.registry import PLACEMENTS
from gpusched.policies.queueing.order import QUEUE_ORDERS
from gpusched.policies.scheduler import Scheduler, SchedulerConfig

from .builders import capacity_snapshot, make_node


MODELS = ("H100-80GB", "A100-40GB", "L40S-48GB", "T4-16GB")   # two MIG-capable, two not
TEAMS = ("t1", "t2", "t3")
POOLS = ("default", "default", "default", "other")
SETTINGS = settings(max_examples=120, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# --- random choices ---------------------------------------------------------------
# Every choice is an integer drawn from a cached strategy: building (and validating) a
# fresh strategy per draw costs more than the reducer itself.
_INTS: dict[tuple[int, int], st.SearchStrategy[int]] = {}


class Rnd:
    def __init__(self, data) -> None:
        self.data = data

    def int(self, lo: int, hi: int) -> int:
        strategy = _INTS.get((lo, hi))
        if strategy is None:
            strategy = _INTS[(lo, hi)] = st.integers(lo, hi)
        return self.data.draw(strategy)

    def pick(self, seq):
        seq = list(seq)
        return seq[self.int(0, len(seq) - 1)]

    def chance(self, one_in: int) -> bool:
        return self.int(0, one_in - 1) == 0


def node_info(r: Rnd, name: str) -> NodeInfo:
    return make_node(
        name,
        gpus=r.int(1, 8),
        model=r.pick(MODELS),
        pool=r.pick(POOLS),
        cpu=r.pick([2_000, 8_000, 32_000, 128_000]),
        mem=r.pick([8_000, 64_000, 512_000]),
        lease=r.pick([0.0, 0.0, 5.0]),       # some run work under a lease: fenced later
        kill_wait=r.pick([0.0, 2.0]),
    )


def cluster(r: Rnd) -> list[NodeInfo]:
    return [node_info(r, f"n{i}") for i in range(r.int(1, 5))]


def job_spec(r: Rnd) -> JobSpec:
    form = r.pick(["whole", "whole", "share", "mig", "cpu"])
    gpus = milli = 0
    mig = ""
    if form == "whole":
        gpus = r.int(1, 4)
    elif form == "share":
        milli = r.pick([100, 250, 333, 500, 750, 1000])
    elif form == "mig":
        mig = r.pick(sorted(PROFILES)) + r.pick(["", ".10gb"])
    workers = r.int(1, 3)
    return JobSpec(
        name="j", team=r.pick(TEAMS), pool=r.pick(POOLS),
        priority_class=r.pick(sorted(PRIORITY_CLASSES)),
        workers=workers,
        resources=WorkerResources(
            gpus=gpus, gpu_milli=milli, mig_profile=mig,
            cpu_milli=r.pick([0, 500, 4_000, 16_000]),
            memory_mib=r.pick([0, 1_000, 32_000]),
            gpu_models=r.pick([(), (), (), ("H100-80GB",), ("L40S-48GB", "T4-16GB")]),
        ),
        preemptible=r.chance(2),
        max_restarts=r.int(0, 2),
        topology=topology_request(r, workers) if r.chance(4) else TopologyRequest(),
    )


# Levels a pool may declare (good and bad) and a job may name (some no pool has). The
# nodes carry no labels, so every node is in one domain at every level: a request the
# pool can honour never stops a cycle's placement, and one it cannot is refused.
POOL_LEVELS = [(), ("spine", "rack"), ("rack", "block"), ("spine", "rack", "block"),
               ("rack", "rack"), ("bad level",), tuple(f"l{i}" for i in range(9))]
JOB_LEVELS = ("", "", "spine", "rack", "block", "zone", "bad level")


def topology_request(r: Rnd, workers: int) -> TopologyRequest:
    size = r.pick([0, 1, workers, 2, 5])
    return TopologyRequest(required=r.pick(JOB_LEVELS), preferred=r.pick(JOB_LEVELS),
                           slice=TopologySlice(r.pick(JOB_LEVELS) if size else "", size))


# --- the simulation harness ---------------------------------------------------------
class History:
    def __init__(self, nodes: list[NodeInfo], retention_s: float = 0.0) -> None:
        self.state = ClusterState(retention_s=retention_s)
        self.events: list[ev.Event] = []
        self.seen_ids: set[str] = set()
        self.now = 1000.0
        self.ids = 0
        self.jobs = 0
        self.stash: list[ev.JobPlaced] = []    # proposals held back: zombies to replay later
        self.terminal: dict[str, tuple] = {}
        self.registered: dict[str, NodeInfo] = {}
        for info in nodes:
            self.emit(ev.NodeRegistered, node=info)

    def emit(self, cls, **kw):
        self.ids += 1
        return self.apply(cls(event_id=f"e{self.ids}", time=self.now, **kw))

    def apply(self, event: ev.Event):
        seen = event.event_id in self.seen_ids
        self.seen_ids.add(event.event_id)
        before = digest(self.state) if seen else None
        self.events.append(event)
        out = apply(self.state, event)
        if seen:
            assert out.duplicate and not out.accepted
            assert digest(self.state) == before
        elif isinstance(event, ev.NodeRegistered) and out.accepted:
            self.registered[event.node.name] = event.node
        elif isinstance(event, ev.JobSubmitted) and out.accepted:
            self.terminal.pop(event.job_id, None)   # the id of a pruned job, reused
        return out

    def job_ids(self) -> list[str]:
        return sorted(self.state.jobs)

    def holding(self) -> list[str]:
        return sorted(j for j, s in self.state.jobs.items() if s.phase.holds_gpus)


# --- actions ------------------------------------------------------------------------
def act_submit(h: History, r: Rnd) -> None:
    # reuse an id in the state (rejected) or, with retention, one already pruned
    reuse = h.jobs and r.int(0, 9) == 0 and h.job_ids() + sorted(j for j in h.terminal if j not in h.state.jobs)
    if reuse:
        job_id = r.pick(reuse)
    else:
        h.jobs += 1
        job_id = f"job{h.jobs}"
    key = r.pick(["", "", "", "k1", "k2"])
    h.emit(ev.JobSubmitted, job_id=job_id, spec=job_spec(r), idempotency_key=key)


def act_schedule(h: History, r: Rnd, hold_back: bool = True) -> None:
    before, snap = digest(h.state), capacity_snapshot(h.state)
    config = SchedulerConfig(queue=r.pick(sorted(QUEUE_ORDERS)), placement=r.pick(sorted(PLACEMENTS)),
                             backfill=r.chance(2))
    decisions = Scheduler(config).cycle(h.state, h.now, CycleMemory())
    # invariant 4 for the scheduler: its tentative bookings leave no trace
    assert digest(h.state) == before and capacity_snapshot(h.state) == snap
    for d in decisions:
        event = ev.JobPlaced(event_id="", job_id=d.job_id, attempt=d.attempt, workers=d.workers, policy=d.policy)
        if hold_back and r.int(0, 3) == 0:
            h.stash.append(event)       # delivered late (or by a zombie) below
            continue
        h.ids += 1
        out = h.apply(ev.JobPlaced(event_id=f"e{h.ids}", time=h.now, job_id=d.job_id, attempt=d.attempt,
                                   workers=d.workers, policy=d.policy))
        # Applied at once, in order, a cycle's proposals are all valid (skipping some only
        # leaves more room for the rest).
        assert out.accepted, out.reason


def act_zombie(h: History, r: Rnd) -> None:
    if not h.stash:
        return
    p = h.stash.pop(r.int(0, len(h.stash) - 1))
    h.emit(ev.JobPlaced, job_id=p.job_id, attempt=p.attempt, workers=p.workers, policy="zombie")


def _random_slots(h: History, r: Rnd, res: WorkerResources, node: str) -> tuple[GpuSlot, ...]:
    n_gpus = len(h.registered[node].gpus) if node in h.registered else 2

    def index() -> int:
        return r.int(-1, n_gpus)       # includes out-of-range on both sides

    form = r.pick(["spec", "spec", "spec", "whole", "share", "mig"])
    if form == "spec":
        form = "mig" if res.is_mig else "share" if res.is_share else "whole"
        profile, milli, count = res.mig_profile, res.gpu_milli, res.gpus
    else:
        profile = r.pick(sorted(PROFILES))
        milli = r.pick([1, 500, 1000])
        count = r.int(0, 3)
    if form == "mig":
        p = parse_profile(profile) or PROFILES["1g"]
        start = r.pick(p.starts) if r.chance(2) else r.int(0, 7)
        return (GpuSlot(index(), p.milli, profile, start),)
    if form == "share":
        return (GpuSlot(index(), milli),)
    return tuple(GpuSlot(index()) for _ in range(count))


def act_random_place(h: History, r: Rnd) -> None:
    if not h.state.jobs:
        return
    job = h.state.jobs[r.pick(h.job_ids())]
    attempt = job.attempt + r.pick([0, 0, 0, -1, 1])
    n = max(0, job.spec.workers + r.pick([0, 0, 0, 0, -1, 1]))
    names = sorted(h.state.nodes) + ["ghost"]
    assignments = []
    for w in range(n):
        node = r.pick(names)
        assignments.append(WorkerAssignment(w, node, _random_slots(h, r, job.spec.resources, node)))
    h.emit(ev.JobPlaced, job_id=job.job_id, attempt=attempt, workers=tuple(assignments), policy="random")


def _pick_worker(h: History, r: Rnd):
    holding = h.holding()
    if not holding or r.int(0, 7) == 0:
        # a report about something that is not live (stale, pending, unknown)
        if not h.state.jobs:
            return None
        job = h.state.jobs[r.pick(h.job_ids())]
        return job, r.int(0, 3), r.pick(sorted(h.state.nodes)), \
            job.attempt + r.pick([0, -1])
    job = h.state.jobs[r.pick(holding)]
    w = job.workers[r.int(0, len(job.workers) - 1)]
    return job, w.worker, w.node, job.attempt


def act_start(h: History, r: Rnd) -> None:
    picked = _pick_worker(h, r)
    if picked:
        job, worker, node, attempt = picked
        h.emit(ev.WorkerStarted, job_id=job.job_id, attempt=attempt, worker=worker, node=node)


def act_finish(h: History, r: Rnd) -> None:
    picked = _pick_worker(h, r)
    if picked:
        job, worker, node, attempt = picked
        code = r.pick([0, 0, 0, 1, 137, EXIT_LOST])
        h.emit(ev.WorkerFinished, job_id=job.job_id, attempt=attempt, worker=worker, node=node, exit_code=code)


def act_start_all(h: History, r: Rnd) -> None:
    """A whole placed gang starts (makes RUNNING and success paths common)."""
    placed = [j for j in h.holding() if h.state.jobs[j].phase is JobPhase.PLACED]
    if placed:
        job = h.state.jobs[r.pick(placed)]
        for w in job.workers:
            h.emit(ev.WorkerStarted, job_id=job.job_id, attempt=job.attempt, worker=w.worker, node=w.node)


def act_cancel(h: History, r: Rnd) -> None:
    if h.state.jobs:
        h.emit(ev.JobCancelled, job_id=r.pick(h.job_ids() + ["ghost"]))


def act_checkpoint(h: History, r: Rnd) -> None:
    picked = _pick_worker(h, r)
    if picked:
        job, _, _, attempt = picked
        h.emit(ev.CheckpointSaved, job_id=job.job_id, attempt=attempt, checkpoint=f"ck{h.ids}",
               progress_s=float(r.int(0, 10_000)))


def act_preempt(h: History, r: Rnd) -> None:
    picked = _pick_worker(h, r)
    if picked:
        job, _, _, attempt = picked
        beneficiary = r.pick(list(h.state.pending) + ["vip"])
        # with a plan (a node per worker, any nodes: the reducer only records them) or not
        planned = tuple(r.pick(list(h.state.nodes) + ["gone"]) for _ in range(r.int(0, 3)))
        h.emit(ev.JobPreempted, job_id=job.job_id, attempt=attempt, for_job=beneficiary, planned_nodes=planned)


def act_attempt_failed(h: History, r: Rnd) -> None:
    picked = _pick_worker(h, r)
    if picked:
        job, _, _, attempt = picked
        h.emit(ev.AttemptFailed, job_id=job.job_id, attempt=attempt, reason="hung", charge=r.chance(2))


def act_node(h: History, r: Rnd) -> None:
    name = r.pick(sorted(h.state.nodes) + ["ghost"])
    kind = r.pick(["lost", "cordon", "uncordon", "uncordon", "register", "register-bad", "new"])
    if kind == "lost":
        h.emit(ev.NodeLost, node=name)
    elif kind == "cordon":
        h.emit(ev.NodeCordoned, node=name)
    elif kind == "uncordon":
        cordoned = sorted(n for n, s in h.state.nodes.items() if s.status is NodeStatus.CORDONED)
        h.emit(ev.NodeUncordoned, node=r.pick(cordoned) if cordoned else name)
    elif kind == "register" and name in h.registered:
        info = h.registered[name]   # the agent restarts with the same inventory
        h.emit(ev.NodeRegistered, node=dataclasses.replace(info, agent_id=f"a{h.ids}"))
    elif kind == "register-bad" and name in h.registered:
        info = h.registered[name]
        bad = make_node(name, gpus=len(info.gpus) + 1, model=info.gpus[0].model, pool=info.pool)
        assert not h.emit(ev.NodeRegistered, node=bad).accepted
    elif kind == "new":
        h.emit(ev.NodeRegistered, node=node_info(r, f"n{len(h.state.nodes)}"))


def act_fence(h: History, r: Rnd) -> None:
    """The supervisor fences a lost node: sometimes too early (rejected), or one that is
    not lost or holds nothing."""
    name = r.pick(sorted(h.state.nodes) + ["ghost"])
    node = h.state.nodes.get(name)
    at = max(h.now, node.fence_at + r.pick([-1.0, 0.0, 0.0, 5.0])) if node is not None else h.now
    if node is not None and node.fence_at and at < node.fence_at:
        at = node.fence_at - 1.0
        assert not h.apply(ev.NodeFenced(event_id=f"f{h.ids}", time=at, node=name)).accepted
        h.ids += 1
        h.now = max(h.now, at)   # the log's clock moved: later events are not older than it
        return
    h.now = max(h.now, at)
    h.emit(ev.NodeFenced, node=name)


def act_time_out(h: History, r: Rnd) -> None:
    picked = _pick_worker(h, r)
    if picked:
        job, _, _, attempt = picked
        h.emit(ev.AttemptTimedOut, job_id=job.job_id, attempt=attempt, reason="time limit")


def act_rendezvous(h: History, r: Rnd) -> None:
    picked = _pick_worker(h, r)
    if picked:
        job, _, node, attempt = picked
        h.emit(ev.RendezvousSet, job_id=job.job_id, attempt=attempt, node=node,
               address=r.pick(["10.0.0.1", ""]), port=r.pick([29500, 0, 70000]))


def act_pool_limits(h: History, r: Rnd) -> None:
    h.emit(ev.PoolTimeLimitsSet, pool=r.pick(POOLS + ("",)), default_s=r.pick([0.0, 60.0, 3600.0]),
           max_s=r.pick([0.0, 0.0, 600.0, 7200.0]))


def act_pool_topology(h: History, r: Rnd) -> None:
    h.emit(ev.PoolTopologySet, pool=r.pick(POOLS + ("",)), levels=r.pick(POOL_LEVELS))


def act_gpu_health(h: History, r: Rnd) -> None:
    name = r.pick(sorted(h.state.nodes))
    index = r.int(-1, len(h.state.nodes[name].gpus))
    h.emit(ev.GpuHealthChanged, node=name, gpu_index=index, healthy=r.chance(2))


def act_duplicate(h: History, r: Rnd) -> None:
    h.apply(r.pick(h.events))


def act_tick(h: History, r: Rnd) -> None:
    h.now += r.pick([0.5, 3.0, 60.0, 400.0])


ACTIONS = (
    [act_submit] * 4 + [act_schedule] * 4 + [act_start_all] * 3 + [act_finish] * 4 + [act_node] * 2
    + [act_start, act_random_place, act_random_place, act_zombie, act_cancel, act_checkpoint,
       act_preempt, act_attempt_failed, act_gpu_health, act_duplicate, act_duplicate, act_tick, act_tick,
       act_fence, act_time_out, act_rendezvous, act_pool_limits, act_pool_topology]
)
