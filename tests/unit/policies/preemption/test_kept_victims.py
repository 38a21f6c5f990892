"""The index of candidate victims kept between the preemptor's rounds (``victim_index``):
after any sequence of events and clock steps it reads exactly as one built afresh, its
kept worker slots are those counted afresh, and rounds decided on it are those of the
full scan (``victim_search_oracle``). A search that
no victim set can satisfy ends on the index's bound without reading the pool's nodes.
"""
from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from gpusched.core import events as ev
from gpusched.core.digest import digest
from gpusched.policies.memory import CycleMemory
from gpusched.policies.preemption.decisions import preemption_decisions, victims_for, why_no_victims
from gpusched.policies.preemption.slot_counts import SlotCounts
from gpusched.policies.preemption.victim_index import CLASSES, VictimIndex
from tests.unit.policies import victim_search_oracle as oracle
from tests.unit.policies.preemption_clusters import BE, HI, NOW, TR, Cluster
from tests.unit.policies.random_preemption import SETTINGS
from tests.unit.policies.preemption.index_clusters import TEAMS, packed_cluster, random_rules
from tests.unit.policies.preemption_configs import other_rules
from tests.unit.policies.preemption.kept_victims_steps import _change


def reading(index: VictimIndex, state) -> dict:
    """Everything a round reads of the index."""
    out: dict = {"spread": sorted(index.spread),
                 "teams": {t: sorted(j.job_id for j in js) for t, js in index.team_jobs().items() if js}}
    for pool in {n.info.pool for n in state.nodes.values()}:
        for mine in CLASSES:
            for reclaim in (False, True):
                out["most", pool, mine, reclaim] = index.most_freeable(pool, mine, reclaim)
                for team in TEAMS:
                    out[pool, mine, team, reclaim] = [(*e[:4], e[4].job_id)
                                                      for e in index.candidates(pool, mine, team, reclaim)]
    return out


@SETTINGS
@given(st.data())
def test_the_kept_index_reads_as_one_built_afresh_after_any_events(data):
    c, now = packed_cluster(data)
    config = random_rules(data)
    memory = CycleMemory()
    kept = memory.victims
    for _ in range(data.draw(st.integers(1, 8))):
        now += data.draw(st.sampled_from([0.0, 0.0005, 1.0, 40.0, 400.0, 700.0]))
        if data.draw(st.integers(0, 9)) == 0:   # another rule set: listed afresh
            config = replace(config, min_runtime_s=data.draw(st.sampled_from([0.0, 300.0, 900.0])))
        for _ in range(data.draw(st.integers(0, 3))):
            _change(c, data, now, config, memory)
        before = digest(c.state)
        assert reading(kept.refresh(c.state, now, config), c.state) \
            == reading(VictimIndex().refresh(c.state, now, config), c.state)
        assert preemption_decisions(c.state, now, memory, config) \
            == oracle.preemption_decisions(c.state, now, config)
        assert digest(c.state) == before
        for shape, counts in kept._slots.items():   # the worker slots kept, as counted afresh
            fresh = SlotCounts(c.state.nodes, *shape[1:])
            assert (counts.on, counts.total) == (fresh.on, fresh.total)


@SETTINGS
@given(st.data())
def test_questions_on_the_kept_index_answer_as_the_full_scan(data):
    """``victims_for`` and ``why_no_victims`` asked with the preemptor's kept index (in
    step with rounds and events before) answer as the full scan and as a fresh index do,
    and leave the index reading as one built afresh."""
    c, now = packed_cluster(data)
    config = random_rules(data)
    memory = CycleMemory()
    kept = memory.victims
    for _ in range(data.draw(st.integers(1, 4))):
        now += data.draw(st.sampled_from([0.0, 1.0, 40.0, 700.0]))
        for _ in range(data.draw(st.integers(0, 3))):
            _change(c, data, now, config, memory)
        before = digest(c.state)
        for job_id in sorted(c.state.pending):
            job = c.state.jobs[job_id]
            assert victims_for(c.state, job, now, memory, config) == oracle.victims_for(c.state, job, now, config)
            assert why_no_victims(c.state, job, now, memory, config) == why_no_victims(c.state, job, now, CycleMemory(), config)
        assert digest(c.state) == before
        assert reading(kept.refresh(c.state, now, config), c.state) \
            == reading(VictimIndex().refresh(c.state, now, config), c.state)


def test_the_questions_are_asked_of_the_kept_index():
    c = Cluster(nodes=1, gpus=1)
    c.running("r", ("n1", (0,)), started=NOW - 1000, priority_class=BE)
    c.pending("p", gpus=1, priority_class=HI)
    config, memory = other_rules(), CycleMemory()
    kept = memory.victims
    kept.refresh(c.state, NOW, config)
    assert victims_for(c.state, c.job("p"), NOW + 1, memory, config) == ("r",)
    assert kept.now == NOW + 1
    assert why_no_victims(c.state, c.job("p"), NOW + 2, memory, config).eligible == 1
    assert kept.now == NOW + 2


def test_a_clock_that_goes_back_lists_afresh():
    """Exempt jobs are listed as time passes them: a round at an earlier time (another
    replica's clock) must not see them listed."""
    c = Cluster(nodes=1, gpus=2)
    c.running("old", ("n1", (0,)), started=NOW - 1000, priority_class=BE)
    c.running("young", ("n1", (1,)), started=NOW - 100, priority_class=BE)   # exempt until NOW + 500
    kept = VictimIndex()
    later = reading(kept.refresh(c.state, NOW + 600, other_rules()), c.state)
    assert [e[4] for e in later["default", 500, "a", False]] == ["young", "old"]
    earlier = reading(kept.refresh(c.state, NOW, other_rules()), c.state)
    assert [e[4] for e in earlier["default", 500, "a", False]] == ["old"]


def test_a_job_past_its_exempt_time_is_listed_without_any_event():
    c = Cluster(nodes=1, gpus=2)
    c.running("young", ("n1", (0,)), started=NOW - 100, priority_class=TR)
    kept = VictimIndex()
    config = other_rules()
    assert list(kept.refresh(c.state, NOW, config).candidates("default", 500, "a", False)) == []
    assert [e[4].job_id for e in kept.refresh(c.state, NOW + 500, config).candidates("default", 500, "a", False)] \
        == ["young"]


def test_a_search_no_victim_set_can_satisfy_reads_no_node(monkeypatch):
    """Every node keeps one GPU of a job no pending job may take: an 8-GPU job can have
    no node, and its search ends on the index's bound, before any node's step."""
    from gpusched.policies.preemption.indexed_search import IndexedSearch
    c = Cluster(nodes=6, gpus=8)
    for n in range(6):
        for g in range(8):
            c.running(f"r{n}-{g}", (f"n{n + 1}", (g,)), started=NOW - 1000,
                      priority_class=HI if g == 0 else BE)
    c.pending("wide", gpus=8, priority_class=HI)
    c.pending("one", gpus=1, priority_class=HI)
    looked: list[str] = []
    step = IndexedSearch.node_step
    monkeypatch.setattr(IndexedSearch, "node_step", lambda self, name: looked.append(name) or step(self, name))
    got = preemption_decisions(c.state, NOW, CycleMemory(), other_rules())
    assert got == oracle.preemption_decisions(c.state, NOW, other_rules())
    assert [d.for_job for d in got] == ["one"]
    assert len(looked) <= 2   # the 1-GPU job's: the 8-GPU job's search read none


def test_kept_worker_slots_count_a_gpu_healthy_again():
    """A GPU back in health changes no job and no fault count: the index compares the
    GPUs' health of a node that had a fault."""
    c = Cluster(nodes=1, gpus=1)
    config, kept = other_rules(), VictimIndex()
    c.pending("p", gpus=1, priority_class=HI)
    shape = (SlotCounts, "default", c.job("p").spec.resources, 1)
    counts = kept.refresh(c.state, NOW, config).slot_counts(shape, ())
    assert counts.total == 1
    for healthy, slots in ((False, 0), (True, 1)):
        assert c.log(ev.GpuHealthChanged, node="n1", gpu_index=0, healthy=healthy, time=NOW).accepted
        kept.refresh(c.state, NOW, config)
        assert (counts.total, counts.on) == (slots, SlotCounts(c.state.nodes, *shape[1:]).on)


def test_the_preemptor_keeps_one_index_per_partition_between_rounds():
    from gpusched.policies.supervision import SupervisionConfig
    from gpusched_preemptor.decide import PreemptorDecider
    c = Cluster(nodes=1, gpus=1)
    c.running("r", ("n1", (0,)), priority_class=BE)
    c.pending("p", gpus=1, priority_class=HI)
    decider = PreemptorDecider("me", other_rules(), SupervisionConfig(), lambda now: ({}, 0.0, False))
    assert [e.job_id for e, _ in decider(0, c.state, NOW)] == ["r"]
    index = decider.memory[0].policies.victims
    assert index.journal.state is c.state and index.now == NOW
    decider(0, c.state, NOW + 1)
    assert decider.memory[0].policies.victims is index and index.now == NOW + 1


def test_a_revoked_partition_s_index_is_dropped_by_the_service_s_revoke_path():
    """The consumer group takes a partition away: the preemptor's revoke hook (what
    ``gpusched-preemptor`` hands the follower) drops that partition's kept index and
    keeps the others'."""
    from gpusched.adapters.log.proposer import PartitionProposer
    from gpusched.policies.supervision import SupervisionConfig
    from gpusched_preemptor.decide import PreemptorDecider
    from gpusched_preemptor.main import revoked
    c = Cluster(nodes=1, gpus=1)
    c.running("r", ("n1", (0,)), priority_class=BE)
    c.pending("p", gpus=1, priority_class=HI)
    decider = PreemptorDecider("me", other_rules(), SupervisionConfig(), lambda now: ({}, 0.0, False))
    decider(0, c.state, NOW)
    decider(1, c.state, NOW)
    kept = decider.memory[1]
    loop = PartitionProposer(None, None, decider, "me")   # type: ignore[arg-type]
    loop.ready_at.update({0: 5, 1: 5})
    revoked(decider, loop, {0})
    assert decider.memory == {1: kept} and loop.ready_at == {1: 5}


def test_the_preemptor_s_round_runs_with_the_cyclic_gc_paused():
    """A round's allocations (a first round builds the pool's index) are not scanned by
    the cyclic GC again and again; it is on again after the round."""
    import gc

    from gpusched.policies.actions import Action
    from gpusched.policies.supervision import SupervisionConfig
    from gpusched_preemptor.decide import PreemptorDecider
    seen: list[bool] = []
    probe = Action("probe", lambda s: seen.append(gc.isenabled()) or [], stops=False, help="")
    decider = PreemptorDecider("me", other_rules(), SupervisionConfig(), lambda now: ({}, 0.0, False),
                               (probe,))
    assert gc.isenabled()
    decider(0, Cluster(nodes=1, gpus=1).state, NOW)
    assert seen == [False] and gc.isenabled()


def test_an_index_kept_for_one_state_is_not_read_for_another():
    """Positions in a journal hold for that state only: another state whose journal is
    longer would otherwise be read from the first one's position on."""
    config, kept = other_rules(), VictimIndex()
    one, other = Cluster(nodes=1, gpus=2), Cluster(nodes=1, gpus=2)
    one.running("a", ("n1", (0,)), started=NOW - 1000, priority_class=BE)
    other.running("b", ("n1", (0,)), started=NOW - 1000, priority_class=BE)
    other.running("c", ("n1", (1,)), started=NOW - 1000, priority_class=BE)
    assert other.state.changes_end() > one.state.changes_end()
    kept.refresh(one.state, NOW, config)
    assert reading(kept.refresh(other.state, NOW, config), other.state) \
        == reading(VictimIndex().refresh(other.state, NOW, config), other.state)
