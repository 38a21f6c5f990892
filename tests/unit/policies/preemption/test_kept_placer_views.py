"""The placer's views kept between the preemptor's rounds beside its index of candidate
victims (``preemption.placer_views``): after any sequence of events and rounds, each
kept view reads, at a round's start, as one built afresh from the state, and rounds (and
questions) that keep them decide as rounds that build them afresh: the preempt action's
and defragmentation's, on pools fragmented so that defragmentation moves jobs."""
from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

from hypothesis import given
from hypothesis import strategies as st

from gpusched.core import events as ev
from gpusched.core.digest import digest
from gpusched.policies.memory import CycleMemory
from gpusched.policies.placement.index import FreeIndex
from gpusched.policies.placement.mig_index import MigIndex
from gpusched.policies.placement.topology import GangCapacities
from gpusched.policies.preemption.decisions import preemption_decisions, preemption_events, victims_for
from gpusched.policies.preemption.defrag import MovableEntries, defrag_decisions
from gpusched.policies.preemption.kept_movable import KeptMovable
from gpusched.policies.preemption.victim_rules import may_move_now
from tests.unit.core.builders import Log, make_node, make_spec, whole
from tests.unit.policies import preemption_oracle as oracle
from tests.unit.policies.kept_index_steps import contents, fresh_like
from tests.unit.policies.preemption.kept_victims_steps import _change, _finish
from tests.unit.policies.preemption_clusters import BE, HI, NOW, TR, Cluster
from tests.unit.policies.preemption.index_clusters import (
    busy_cluster, config_for, fragmented_cluster, packed_cluster, random_rules,
)
from tests.unit.policies.random_preemption import SETTINGS
from tests.unit.policies.preemption_configs import other_rules

NODE_VIEWS = (FreeIndex, MigIndex, GangCapacities)


def assert_kept_as_fresh(memory: CycleMemory, state) -> None:
    """Bring the kept views in step as a round's start does: each node view must read as
    one built afresh from the state."""
    kept = memory.indexes
    kept.refresh(state)
    for key, index in kept.indexes.items():
        if isinstance(index, NODE_VIEWS):
            assert contents(index) == contents(fresh_like(index, state)), key


def assert_movable_as_fresh(memory: CycleMemory, state, now: float, config) -> None:
    """Bring each pool's kept movable jobs in step as a call's first plan does: they must
    list the entries a fresh ``MovableEntries`` lists at ``now``."""
    for pool, movable in memory.movable.items():
        kept = movable.refresh(state, state.nodes, now, config).entries(now)
        fresh = MovableEntries(state.nodes, state.jobs, pool, now, config).entries
        assert [e[:4] + (e[4].job_id,) for e in kept] == [e[:4] + (e[4].job_id,) for e in fresh]


def a_cluster(data):
    """A pool packed with victims (``packed_cluster``), or one filled by the scheduler with
    whole GPUs, shares and gangs on two GPU models (``busy_cluster``), with MIG slices
    waiting (placed by the scheduler between rounds, or their victims found)."""
    if data.draw(st.booleans()):
        return packed_cluster(data)
    log, now = busy_cluster(data)
    for k in range(data.draw(st.integers(0, 3))):
        spec = make_spec(f"t{k % 2}", mig=data.draw(st.sampled_from(["1g", "3g", "7g"])), cpu=0, mem=0,
                         name=f"m{k}", priority_class=data.draw(st.sampled_from([BE, HI])))
        assert log(ev.JobSubmitted, job_id=f"m{k}", spec=spec, time=now).accepted
    return SimpleNamespace(log=log, state=log.state), now


def _next_round(c, data, now: float, config, memory: CycleMemory, most: int) -> float:
    """The clock of the next round, and up to ``most`` changes of the log before it."""
    now += data.draw(st.sampled_from([0.0, 1.0, 40.0, 700.0]))
    for _ in range(data.draw(st.integers(0, most))):
        _change(c, data, now, config, memory)
    return now


@SETTINGS
@given(st.data())
def test_rounds_that_keep_placer_views_decide_as_rounds_that_build_them(data):
    c, now = a_cluster(data)
    config = random_rules(data)
    memory = CycleMemory()
    for _ in range(data.draw(st.integers(2, 6))):
        now = _next_round(c, data, now, config, memory, 3)
        state, before = c.state, digest(c.state)
        assert preemption_decisions(state, now, memory, config) \
            == preemption_decisions(state, now, CycleMemory(), config)
        if state.pending and data.draw(st.booleans()):
            job = state.jobs[data.draw(st.sampled_from(sorted(state.pending)))]
            assert victims_for(state, job, now, memory, config) \
                == victims_for(state, job, now, CycleMemory(), config)
        assert digest(state) == before
        assert_kept_as_fresh(memory, state)


def _moved(c, data, decisions, now: float) -> None:
    """The log's answer to some defragmentation plans: the moved jobs preempted, and
    (often) their workers finished, so they wait again and the pool's holes move."""
    for decision in decisions[: data.draw(st.integers(0, 2))]:
        for e in preemption_events(c.state, decision, now):
            c.log.replay(e)
        if data.draw(st.booleans()):
            for vid in decision.victims:
                _finish(c, c.state.jobs[vid], now)


@SETTINGS
@given(st.data())
def test_defrag_rounds_that_keep_placer_views_decide_as_rounds_that_build_them(data):
    """Rounds as the preemptor runs them (preempt, then defragmentation, on one kept
    memory) on fragmented pools, the plans of one round carried out before the next."""
    log, now = fragmented_cluster(data)
    c = SimpleNamespace(log=log, state=log.state)
    config = config_for(data) if data.draw(st.booleans()) else random_rules(data)
    # Work at risk grows past the cap between rounds (``kept_movable``'s cut).
    config = replace(config, defrag_max_work_lost_s=data.draw(st.sampled_from([300.0, 600.0, 2000.0])))
    memory = CycleMemory()
    for _ in range(data.draw(st.integers(2, 5))):
        now = _next_round(c, data, now, config, memory, 2)
        state, before = c.state, digest(c.state)
        if data.draw(st.booleans()):   # the preempt action ran first this round
            assert preemption_decisions(state, now, memory, config) \
                == preemption_decisions(state, now, CycleMemory(), config)
        plans = defrag_decisions(state, now, memory, config)
        # Views built for the round; and fresh views for each question with plans that
        # step every node (``defrag.stepped_search``), not only those the index reads.
        assert plans == defrag_decisions(state, now, CycleMemory(), config) == oracle.defrag_decisions(state, now, config)
        assert digest(state) == before
        assert_kept_as_fresh(memory, state)
        assert_movable_as_fresh(memory, state, now, config)
        _moved(c, data, plans, now)


def _varied_job(log: Log, jid: str, slots: list[tuple[str, int]], data) -> None:
    """``jid`` on ``slots`` (node, GPU) per worker, varied in all that defragmentation's
    rule reads: preemptible or not, checkpointable or not, its start, last checkpoint,
    preemptions before (its exempt time) and phase (placed, running, preempting, stopping)."""
    d = data.draw
    preemptible = d(st.integers(0, 3)) > 0
    spec = replace(make_spec(name=jid, gpus=1, workers=len(slots), cpu=0, mem=0, preemptible=preemptible,
                             priority_class=d(st.sampled_from([BE, TR]))),
                   checkpoint_interval_s=d(st.sampled_from([0.0, 300.0, 300.0])))
    started, preempted = NOW - d(st.sampled_from([10.0, 400.0, 1000.0, 5000.0])), d(st.sampled_from([0, 0, 1]))
    preempted *= preemptible
    phase = d(st.sampled_from(["placed", "running", "running", "preempting" if preemptible else "stopping",
                               "stopping"]))
    assigned = tuple(ev.WorkerAssignment(i, node, whole(gpu)) for i, (node, gpu) in enumerate(slots))
    assert log(ev.JobSubmitted, job_id=jid, spec=spec, time=started - 200).accepted
    for attempt in range(preempted + 1):
        at = started - 100 * (preempted - attempt)
        assert log(ev.JobPlaced, job_id=jid, attempt=attempt, workers=assigned, time=at).accepted
        if attempt == preempted and phase == "placed":
            return
        for w in assigned:
            assert log(ev.WorkerStarted, job_id=jid, attempt=attempt, worker=w.worker, node=w.node, time=at).accepted
        if attempt < preempted:
            assert log(ev.JobPreempted, job_id=jid, attempt=attempt, for_job="x", reason="priority: preempted for x",
                       time=at + 50).accepted
            for w in assigned:
                assert log(ev.WorkerFinished, job_id=jid, attempt=attempt, worker=w.worker, node=w.node,
                           exit_code=0, time=at + 50).accepted
    if d(st.booleans()):
        assert log(ev.CheckpointSaved, job_id=jid, attempt=preempted, checkpoint="c",
                   time=d(st.sampled_from([started + 5.0, NOW - 50.0]))).accepted
    if phase == "preempting":
        assert log(ev.JobPreempted, job_id=jid, attempt=preempted, for_job="x", reason="priority: preempted for x",
                   time=NOW).accepted
    elif phase == "stopping":
        assert log(ev.JobCancelled, job_id=jid, time=NOW).accepted


@SETTINGS
@given(st.data())
def test_kept_movable_jobs_are_those_defrag_may_move(data):
    """On a pool of varied jobs, at a few clocks with changes of the log between them, the
    kept movable jobs (``KeptMovable``) are on each node the jobs defragmentation's own
    rule (``victim_rules.may_move_now``) says may move: the two read one rule."""
    d = data.draw
    log = Log(*(make_node(f"n{i}", gpus=4) for i in range(d(st.integers(1, 3)))))
    slots = d(st.permutations([(name, gpu) for name in log.state.nodes for gpu in range(4)]))
    k = 0
    while slots and d(st.integers(0, 5)):
        workers = min(len(slots), d(st.sampled_from([1, 1, 2])))
        _varied_job(log, f"j{k}", slots[:workers], data)
        slots, k = slots[workers:], k + 1
    c, now = SimpleNamespace(log=log, state=log.state), NOW
    config = replace(random_rules(data), defrag_max_work_lost_s=d(st.sampled_from([300.0, 2000.0, 1e9])))
    kept, memory = KeptMovable("default"), CycleMemory()
    for _ in range(d(st.integers(1, 4))):
        state = c.state
        listed = kept.refresh(state, state.nodes, now, config).entries(now)
        assert {(e[2], e[4].job_id) for e in listed} == {
            (name, jid) for name, node in state.nodes.items() for jid in node.jobs
            if may_move_now(state.jobs[jid], now, config)}
        now = _next_round(c, data, now, config, memory, 2)


def _full_pool() -> Cluster:
    c = Cluster(nodes=3, gpus=2)
    for n in range(3):
        for g in range(2):
            c.running(f"r{n}-{g}", (f"n{n + 1}", (g,)), priority_class=BE)
    c.pending("p0", gpus=1, priority_class=HI)
    c.pending("p1", gpus=2, priority_class=HI)
    return c


def test_what_a_call_changed_and_undid_does_not_stay_in_the_kept_views():
    """A call releases a job tentatively and asks the placer (which then hears of the
    freed GPU) about a job that still does not fit, so the placer books nothing there; the
    release undone, the kept views must not keep the freed GPU: the kept set noted the
    node when the placer's views heard of it (``PlacerViews._catch_up``)."""
    from gpusched.policies.preemption.search_context import SearchContext
    c = _full_pool()
    memory = CycleMemory()
    ctx = SearchContext(c.state, NOW, other_rules(), memory)
    with ctx.tentative() as scratch:
        scratch.release(c.state.jobs["r1-0"])
        assert ctx.place(c.state.jobs["p1"]) is None
    assert_kept_as_fresh(memory, c.state)


def test_a_later_round_builds_no_free_index(monkeypatch):
    """The second round reads the first round's ``FreeIndex`` (brought in step), not one
    built from every node again; the decisions are those of a fresh build."""
    c = _full_pool()
    built: list[str] = []
    init = FreeIndex.__init__
    monkeypatch.setattr(FreeIndex, "__init__", lambda self, *a: built.append(a[1]) or init(self, *a))
    memory = CycleMemory()
    first = preemption_decisions(c.state, NOW, memory, other_rules())
    assert first and built == ["default"] and first == oracle.preemption_decisions(c.state, NOW, other_rules())
    index = memory.indexes.indexes["free", "default"]
    built.clear()
    assert preemption_decisions(c.state, NOW + 1, memory, other_rules()) == first
    assert built == [] and memory.indexes.indexes["free", "default"] is index


def test_the_preemptor_keeps_placer_views_per_partition_and_drops_them_on_revoke():
    from gpusched.adapters.log.proposer import PartitionProposer
    from gpusched.policies.supervision import SupervisionConfig
    from gpusched_preemptor.decide import PreemptorDecider
    from gpusched_preemptor.main import revoked
    from tests.unit.policies import victim_search_oracle as oracle
    c = _full_pool()
    decider = PreemptorDecider("me", other_rules(), SupervisionConfig(), lambda now: ({}, 0.0, False))
    assert decider(0, c.state, NOW)
    kept = decider.memory[0].policies.indexes
    index = kept.indexes["free", "default"]
    decider(0, c.state, NOW + 1)
    decider(1, c.state, NOW + 1)
    assert decider.memory[0].policies.indexes is kept and kept.indexes["free", "default"] is index
    loop = PartitionProposer(None, None, decider, "me")   # type: ignore[arg-type]
    revoked(decider, loop, {0})
    assert list(decider.memory) == [1]


def _fragmented_rounds() -> tuple[list, list]:
    """Two defragmentation rounds on kept views, the first's plan carried out between
    them; the FreeIndex pools built in each round."""
    from tests.unit.policies.defrag_clusters import NOW as AT, fragmented
    c = fragmented()
    c.pending("big2", gpus=8)
    memory, built, rounds = CycleMemory(), [], []
    init = FreeIndex.__init__
    FreeIndex.__init__ = lambda self, *a: built.append(a[1]) or init(self, *a)   # type: ignore[method-assign]
    try:
        for now in (AT, AT + 1):
            built.clear()
            plans = defrag_decisions(c.state, now, memory)
            rounds.append((plans, list(built)))   # before the oracle's builds
            assert plans == oracle.defrag_decisions(c.state, now)
            for e in preemption_events(c.state, plans[0], now):
                assert c.log.replay(e).accepted
    finally:
        FreeIndex.__init__ = init   # type: ignore[method-assign]
    return rounds


def test_a_later_defrag_round_builds_no_free_index():
    """The second round reads the first round's kept ``FreeIndex`` (brought in step with
    the moves the log took), not one built from every node again, and plans again."""
    (first, built_first), (second, built_second) = _fragmented_rounds()
    assert [p.for_job for p in first] == ["big"] and first[0].reason == "defragmentation"
    assert built_first == ["default"] and built_second == []
    assert [p.for_job for p in second] == ["big2"]


def test_the_preemptors_defrag_action_reads_the_rounds_kept_views(monkeypatch):
    """In the preemptor's round the preempt action finds nothing to preempt and builds the
    pool's ``FreeIndex``; defragmentation then reads that one (the partition's memory)."""
    from gpusched.policies.supervision import SupervisionConfig
    from gpusched_preemptor.decide import PreemptorDecider
    from tests.unit.policies import victim_search_oracle as oracle
    from tests.unit.policies.defrag_clusters import NOW as AT, fragmented
    c = fragmented()
    built: list[str] = []
    init = FreeIndex.__init__
    monkeypatch.setattr(FreeIndex, "__init__", lambda self, *a: built.append(a[1]) or init(self, *a))
    decider = PreemptorDecider("me", other_rules(), SupervisionConfig(), lambda now: ({}, 0.0, False))
    proposals = decider(0, c.state, AT)
    assert [(e.job_id, e.reason) for e, _ in proposals] == [("a", "defragmentation: preempted for big")]
    assert built == ["default"]


def test_a_later_defrag_round_lists_no_pool_afresh(monkeypatch):
    """The second round reads the movable jobs kept by the first (brought in step with the
    moves the log took), neither listed afresh (``MovableEntries``) nor started over."""
    from gpusched.policies.preemption.kept_movable import KeptMovable
    listings: list[str] = []
    reset, init = KeptMovable._reset, MovableEntries.__init__
    monkeypatch.setattr(KeptMovable, "_reset", lambda self: listings.append("kept") or reset(self))
    monkeypatch.setattr(MovableEntries, "__init__", lambda self, *a: listings.append("fresh") or init(self, *a))
    from tests.unit.policies.defrag_clusters import NOW as AT, fragmented
    c = fragmented()
    c.pending("big2", gpus=8)
    memory = CycleMemory()
    first = defrag_decisions(c.state, AT, memory)
    assert [p.for_job for p in first] == ["big"] and listings == ["kept", "kept"]   # made, then listed
    for e in preemption_events(c.state, first[0], AT):
        assert c.log.replay(e).accepted
    listings.clear()
    second = defrag_decisions(c.state, AT + 1, memory)
    assert [p.for_job for p in second] == ["big2"] and listings == []
    assert second == oracle.defrag_decisions(c.state, AT + 1)
