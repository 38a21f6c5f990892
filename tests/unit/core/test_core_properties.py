"""Property tests: random clusters and random histories keep the invariants of
docs/design/architecture.md section 6, whatever mix of valid, stale, adversarial and duplicated
events the log holds.

The invariants are recomputed here from the jobs alone (what each job holding GPUs was
given), never read from the reducer's own counters, and then compared with them.
"""
from __future__ import annotations

import copy
from collections import defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.adapters.log import codec
from gpusched.core import events as ev
from gpusched.core.digest import digest
from gpusched.core.mig import FULL_MASK, parse_profile
from gpusched.core.model import JobPhase, NodeStatus
from gpusched.core.reducer import apply
from gpusched.core.state import ClusterState
from gpusched.policies.memory import CycleMemory
from gpusched.policies.placement.registry import PLACEMENTS
from gpusched.policies.queueing.order import QUEUE_ORDERS
from gpusched.policies.scheduler import Scheduler, SchedulerConfig
from tests.unit.policies.shape_skim import offer_every_shape

from .random_histories import (
    SETTINGS, Rnd, cluster, History, act_submit, act_schedule, act_finish, act_start_all, act_tick,
    ACTIONS,
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
    full, parking, memory = Scheduler(config), Scheduler(config), CycleMemory()
    skipped = 0
    for _ in range(r.int(5, 60)):
        r.pick(ACTIONS + [act_submit] * 4)(h, r)
        known = len(memory.parked.current(h.state, h.now) & h.state.pending.keys())
        with pytest.MonkeyPatch.context() as patch:
            offer_every_shape(patch)
            expected = full.cycle(h.state, h.now, CycleMemory())
        got = parking.cycle(h.state, h.now, memory)
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
