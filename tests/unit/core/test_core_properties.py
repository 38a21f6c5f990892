"""Property tests: random clusters and random histories keep the invariants of
docs/architecture.md section 6, whatever mix of valid, stale, adversarial and duplicated
events the log holds.

The invariants are recomputed here from the jobs alone (what each job holding GPUs was
given), never read from the reducer's own counters, and then compared with them.
"""
from __future__ import annotations

import copy
import dataclasses
from collections import defaultdict

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpusched.adapters import codec
from gpusched.core import events as ev
from gpusched.core.digest import digest
from gpusched.core.mig import FULL_MASK, PROFILES, parse_profile
from gpusched.core.model import (
    EXIT_LOST, GpuSlot, JobPhase, JobSpec, NodeInfo, NodeStatus, WorkerAssignment, WorkerResources,
)
from gpusched.core.priority import PRIORITY_CLASSES
from gpusched.core.reducer import apply
from gpusched.core.state import ClusterState
from gpusched.policies.queueing.parking import ParkedJobs
from gpusched.policies.placement.registry import PLACEMENTS
from gpusched.policies.queueing.order import QUEUE_ORDERS
from gpusched.policies.queueing.keys import QueueKeys
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
    return JobSpec(
        name="j", team=r.pick(TEAMS), pool=r.pick(POOLS),
        priority_class=r.pick(sorted(PRIORITY_CLASSES)),
        workers=r.int(1, 3),
        resources=WorkerResources(
            gpus=gpus, gpu_milli=milli, mig_profile=mig,
            cpu_milli=r.pick([0, 500, 4_000, 16_000]),
            memory_mib=r.pick([0, 1_000, 32_000]),
            gpu_models=r.pick([(), (), (), ("H100-80GB",), ("L40S-48GB", "T4-16GB")]),
        ),
        preemptible=r.chance(2),
        max_restarts=r.int(0, 2),
    )


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
    decisions = Scheduler(config).cycle(h.state, h.now)
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
       act_fence, act_time_out, act_rendezvous, act_pool_limits]
)


# more time passing and more jobs ending, so that retention has jobs to prune
RETENTION_ACTIONS = ACTIONS + [act_tick] * 4 + [act_finish] * 3 + [act_start_all] * 2


def act_set_retention(h: History, r: Rnd) -> None:
    """The log's retention changes (admission restarted with another --job-retention)."""
    h.emit(ev.JobRetentionSet, job_retention_s=r.pick([0.0, 1.0, 30.0, 500.0]))

# --- invariants, recomputed independently -------------------------------------------
def _terminal_record(job) -> tuple:
    return (job.phase, job.reason, job.attempt, job.ended_at, job.restarts, job.preemptions,
            job.workers, tuple(sorted(job.finished.items())))


def check_invariants(state: ClusterState, terminal: dict[str, tuple]) -> None:
    used: dict[tuple[str, int], int] = defaultdict(int)
    masks: dict[tuple[str, int], int] = defaultdict(int)
    cpu: dict[str, int] = defaultdict(int)
    mem: dict[str, int] = defaultdict(int)
    on_node: dict[str, set[str]] = defaultdict(set)
    usage: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])

    assert list(state.pending) == [j for j in state.pending if j in state.jobs]
    assert set(state.idempotency.values()) <= state.jobs.keys()
    # retention: only terminal jobs go, and exactly those the log's clock has left behind
    # (event times only grow here, so the order they ended is the order of their ends)
    horizon = state.clock - state.retention_s
    for jid, record in terminal.items():
        if jid not in state.jobs:
            assert state.retention_s > 0 and record[3] <= horizon, f"{jid} pruned early"
    if state.retention_s > 0:
        assert all(j.ended_at > horizon for j in state.jobs.values() if j.phase.terminal)
    else:
        assert state.pruned == 0 and not state.ended
    # nominations (capacity held for a preemption's beneficiary) exist only for pending
    # jobs, and name real nodes (a plan's one per worker, so a node may repeat)
    for jid, (nodes, _) in state.nominations.items():
        assert jid in state.pending, f"nomination for {jid} which is not pending"
        assert nodes and set(nodes) <= set(state.nodes)
    for jid, job in state.jobs.items():
        # (3) exactly one phase; terminal phases never change
        assert isinstance(job.phase, JobPhase)
        assert (jid in state.pending) == (job.phase is JobPhase.PENDING), (jid, job.phase)
        if jid in terminal:
            assert _terminal_record(job) == terminal[jid], f"terminal job {jid} changed"
        elif job.phase.terminal:
            terminal[jid] = _terminal_record(job)
        if job.phase is JobPhase.PENDING:
            assert job.workers == () and not job.started and not job.finished
        if not job.phase.holds_gpus:
            continue
        # (2) gang all or nothing, one set of GPUs
        spec, res = job.spec, job.spec.resources
        assert sorted(w.worker for w in job.workers) == list(range(spec.workers)), jid
        ids = {w.worker for w in job.workers}
        assert job.started <= ids and set(job.finished) <= ids
        if job.phase is JobPhase.RUNNING:
            assert job.started == ids
        # (5) an ending attempt holds everything until its last worker is gone; then it
        # has moved on, so a stopping job always waits for at least one worker
        stopping = job.phase is JobPhase.STOPPING
        assert bool(job.stop_then) is stopping, (jid, job.phase, job.stop_then)
        if stopping:
            assert len(job.finished) < len(job.workers), f"{jid} stopped but still holds"
        alloc = 0
        for w in job.workers:
            node = state.nodes[w.node]
            lost = node.status is NodeStatus.LOST
            # held on a lost node only by a stopping attempt: until its fence for a worker
            # that may still run there, until the attempt's last worker is gone for the rest
            assert not lost or (stopping and (w.worker in job.finished or node.fence_at)), \
                f"{jid} holds GPUs on lost {w.node} not awaiting its fence"
            assert node.info.pool == spec.pool
            on_node[w.node].add(jid)
            cpu[w.node] += res.cpu_milli
            mem[w.node] += res.memory_mib
            for s in w.gpus:
                gpu = node.gpus[s.index]
                key = (w.node, s.index)
                assert gpu.healthy or stopping, f"{jid} holds unhealthy GPU {key} and is not stopping"
                assert res.allows(gpu.info.model)
                if s.mig_profile:
                    profile = parse_profile(s.mig_profile)
                    assert gpu.info.mig_capable and s.mig_start in profile.starts
                    mask = profile.mask(s.mig_start)
                    assert not masks[key] & mask, f"MIG overlap on {key}"
                    masks[key] |= mask
                    alloc += profile.milli
                else:
                    used[key] += s.milli
                    alloc += s.milli
        u = usage[job.team]
        u[0] += alloc
        u[1] += res.cpu_milli * len(job.workers)
        u[2] += res.memory_mib * len(job.workers)
        u[3] += 1
    # (1) capacity, and the reducer's counters agree with the recomputation
    for name, node in state.nodes.items():
        assert node.used_cpu == cpu[name] and cpu[name] <= node.info.cpu_milli, name
        assert node.used_mem == mem[name] and mem[name] <= node.info.memory_mib, name
        assert node.jobs == on_node[name], name
        for i, gpu in enumerate(node.gpus):
            key = (name, i)
            assert gpu.info.index == i
            assert gpu.used_milli == used[key] and 0 <= used[key] <= 1000, key
            assert gpu.mig_mask == masks[key] and masks[key] <= FULL_MASK, key
            assert not (used[key] and masks[key]), f"{key} both shared and MIG"
    # (5) quota accounting = sum of the team's allocations
    actual = {t: [u.gpu_milli, u.cpu_milli, u.memory_mib, u.jobs] for t, u in state.usage.items()
              if u.gpu_milli or u.cpu_milli or u.memory_mib or u.jobs}
    assert actual == {t: v for t, v in usage.items() if any(v)}


def replay(events: list[ev.Event], state: ClusterState | None = None, retention_s: float = 0.0) -> ClusterState:
    state = state or ClusterState(retention_s=retention_s)
    for e in events:
        apply(state, e)
    return state


# --- the properties -----------------------------------------------------------------
@SETTINGS
@given(data=st.data())
def test_random_histories_keep_invariants_and_replay_to_same_digest(data):
    r = Rnd(data)
    h = History(cluster(r))
    check_invariants(h.state, h.terminal)
    for _ in range(r.int(5, 60)):
        r.pick(ACTIONS)(h, r)
        check_invariants(h.state, h.terminal)

    final = digest(h.state)
    # (4) replay from zero (this also proves the scheduler cycles left no trace)
    assert digest(replay(h.events)) == final
    # ... with duplicates of earlier events inserted anywhere after their original
    dup = list(h.events)
    for _ in range(r.int(1, 10)):
        i = r.int(0, len(dup) - 1)
        dup.insert(r.int(i + 1, len(dup)), dup[i])
    assert digest(replay(dup)) == final
    # ... from a snapshot taken at any offset, then the tail
    k = r.int(0, len(h.events))
    snapshot = copy.deepcopy(replay(h.events[:k]))
    assert digest(replay(h.events[k:], snapshot)) == final
    # ... and through the wire format
    wire = [codec.decode(codec.encode(e, "default"))[0] for e in h.events]
    assert digest(replay(wire)) == final


@settings(SETTINGS, max_examples=80)
@given(data=st.data())
def test_histories_with_retention_prune_only_old_terminal_jobs_and_replay_the_same(data):
    """The same random histories with finished jobs pruned: the invariants hold (pruned
    jobs were terminal and past the retention, ``check_invariants``), and every replay
    with the same retention reaches the same digest."""
    r = Rnd(data)
    retention = r.pick([1.0, 30.0, 500.0])
    h = History(cluster(r), retention_s=retention)
    for _ in range(r.int(5, 80)):
        r.pick(RETENTION_ACTIONS)(h, r)
        check_invariants(h.state, h.terminal)
    final = digest(h.state)
    assert digest(replay(h.events, retention_s=retention)) == final
    k = r.int(0, len(h.events))
    snapshot = copy.deepcopy(replay(h.events[:k], retention_s=retention))
    assert digest(replay(h.events[k:], snapshot)) == final


@settings(SETTINGS, max_examples=80)
@given(data=st.data())
def test_retention_changed_in_the_log_mid_history_replays_the_same_and_holds_from_then_on(data):
    """Random histories with JobRetentionSet at random points: replays from scratch and
    from a snapshot plus the tail agree, and once the clock moves past the last value
    set, no terminal job older than it is left."""
    r = Rnd(data)
    h = History(cluster(r))
    for _ in range(r.int(5, 80)):
        r.pick(RETENTION_ACTIONS + [act_set_retention] * 3)(h, r)
    final = digest(h.state)
    assert digest(replay(h.events)) == final
    k = r.int(0, len(h.events))
    assert digest(replay(h.events[k:], copy.deepcopy(replay(h.events[:k])))) == final
    h.now += 1.0
    h.emit(ev.NodeCordoned, node="no-such-node")   # rejected, but it moves the clock
    kept = h.state.retention_s
    if kept > 0:
        horizon = h.state.clock - kept
        assert all(j.ended_at > horizon for j in h.state.jobs.values() if j.phase.terminal)
    else:
        assert not h.state.ended and h.state.prune_at == 0.0


@settings(SETTINGS, max_examples=100)
@given(data=st.data())
def test_parked_cycles_decide_what_full_cycles_decide(data):
    """A scheduler that parks jobs known not to fit (policies.queueing.parking), keeps their keys
    and shapes and skips the jobs of shapes that failed (policies.queueing.keys), and one
    that offers every job, same config and same history of cycles: the same decisions
    at every cycle, whatever happened to the state in between."""
    r = Rnd(data)
    h = History(cluster(r))
    config = SchedulerConfig(queue=r.pick(sorted(QUEUE_ORDERS)), placement=r.pick(sorted(PLACEMENTS)),
                             backfill=r.chance(4))
    full, parking, parked, keys = Scheduler(config), Scheduler(config), ParkedJobs(), QueueKeys()
    skipped = 0
    for _ in range(r.int(5, 60)):
        r.pick(ACTIONS + [act_submit] * 4)(h, r)
        known = len(parked.current(h.state, h.now) & h.state.pending.keys())
        expected = full.cycle(h.state, h.now)
        got = parking.cycle(h.state, h.now, parked, keys)
        assert [(d.job_id, d.attempt, d.workers) for d in got] == [(d.job_id, d.attempt, d.workers) for d in expected]
        skipped += known
        for d in expected if r.chance(2) else ():   # proposals lost or rejected: not applied
            h.ids += 1
            h.apply(ev.JobPlaced(event_id=f"e{h.ids}", time=h.now, job_id=d.job_id, attempt=d.attempt,
                                 workers=d.workers, policy=d.policy))
        check_invariants(h.state, h.terminal)
    data.draw(st.just(skipped), label="parked jobs skipped")


@settings(SETTINGS, max_examples=60)
@given(data=st.data())
def test_scheduler_alone_never_oversubscribes(data):
    """Only the real scheduler proposes, into a crowded queue: everything it proposes
    in one cycle is accepted (asserted in act_schedule) and capacity holds."""
    r = Rnd(data)
    h = History(cluster(r))
    for _ in range(r.int(1, 30)):
        act_submit(h, r)
    for _ in range(3):
        act_schedule(h, r, hold_back=False)
        check_invariants(h.state, h.terminal)
        act_start_all(h, r)
        act_finish(h, r)
        check_invariants(h.state, h.terminal)
        act_tick(h, r)
    assert digest(replay(h.events)) == digest(h.state)
