"""The placer's views kept between the preemptor's rounds beside its index of candidate
victims (``preemption.placer_views``): after any sequence of events and rounds, each
kept view reads, at a round's start, as one built afresh from the state, and rounds (and
questions) that keep them decide as rounds that build them afresh."""
from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given
from hypothesis import strategies as st

from gpusched.core import events as ev
from gpusched.core.digest import digest
from gpusched.policies.placement.index import FreeIndex
from gpusched.policies.placement.kept_index import KEPT
from gpusched.policies.placement.mig_index import MigIndex
from gpusched.policies.placement.topology import GangCapacities
from gpusched.policies.preemption.decisions import preemption_decisions, victims_for
from gpusched.policies.preemption.victim_index import VictimIndex
from tests.unit.core.builders import make_spec
from tests.unit.policies.test_kept_index import contents, fresh_like
from tests.unit.policies.test_kept_victims import _change
from tests.unit.policies.test_preemption import BE, HI, NOW, Cluster
from tests.unit.policies.test_preemption_index import busy_cluster
from tests.unit.policies.test_preemption_properties import SETTINGS
from tests.unit.policies.test_victim_index import packed_cluster, random_rules

NODE_VIEWS = (FreeIndex, MigIndex, GangCapacities)


def assert_kept_as_fresh(views: dict, state) -> None:
    """Bring the kept views in step as a round's start does: each node view must read as
    one built afresh from the state."""
    kept = views.get(KEPT)
    if kept is not None:
        kept.refresh(state)
        for key, index in kept.indexes.items():
            if isinstance(index, NODE_VIEWS):
                assert contents(index) == contents(fresh_like(index, state)), key


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


@SETTINGS
@given(st.data())
def test_rounds_that_keep_placer_views_decide_as_rounds_that_build_them(data):
    c, now = a_cluster(data)
    config = random_rules(data)
    victims, views = VictimIndex(), {}
    for _ in range(data.draw(st.integers(2, 6))):
        now += data.draw(st.sampled_from([0.0, 1.0, 40.0, 700.0]))
        for _ in range(data.draw(st.integers(0, 3))):
            _change(c, data, now, config, victims)
        state, before = c.state, digest(c.state)
        assert preemption_decisions(state, now, config, victims=victims, kept=views) \
            == preemption_decisions(state, now, config)
        if state.pending and data.draw(st.booleans()):
            job = state.jobs[data.draw(st.sampled_from(sorted(state.pending)))]
            assert victims_for(state, job, now, config, victims=victims, kept=views) \
                == victims_for(state, job, now, config)
        assert digest(state) == before
        assert_kept_as_fresh(views, state)


def _full_pool() -> Cluster:
    c = Cluster(nodes=3, gpus=2)
    for n in range(3):
        for g in range(2):
            c.running(f"r{n}-{g}", (f"n{n + 1}", (g,)), priority_class=BE)
    c.pending("p0", gpus=1, priority_class=HI)
    c.pending("p1", gpus=2, priority_class=HI)
    return c


def test_a_later_round_builds_no_free_index(monkeypatch):
    """The second round reads the first round's ``FreeIndex`` (brought in step), not one
    built from every node again; the decisions are those of a fresh build."""
    from tests.unit.policies import preemption_oracle as oracle
    c = _full_pool()
    built: list[str] = []
    init = FreeIndex.__init__
    monkeypatch.setattr(FreeIndex, "__init__", lambda self, *a: built.append(a[1]) or init(self, *a))
    victims, views = VictimIndex(), {}
    first = preemption_decisions(c.state, NOW, victims=victims, kept=views)
    assert built == ["default"] and first == oracle.preemption_decisions(c.state, NOW)
    index = views[KEPT].indexes["free", "default"]
    built.clear()
    assert preemption_decisions(c.state, NOW + 1, victims=victims, kept=views) == first
    assert built == [] and views[KEPT].indexes["free", "default"] is index


def test_the_preemptor_keeps_placer_views_per_partition_and_drops_them_on_revoke():
    from gpusched.adapters.proposer import PartitionProposer
    from gpusched.policies.supervision import SupervisionConfig
    from gpusched_preemptor.decide import PreemptorDecider
    from gpusched_preemptor.main import revoked
    from tests.unit.policies import victim_search_oracle as oracle
    c = _full_pool()
    decider = PreemptorDecider("me", oracle.PreemptionConfig(), SupervisionConfig(), lambda now: ({}, 0.0, False))
    assert decider(0, c.state, NOW)
    kept = decider.kept[0][KEPT]
    index = kept.indexes["free", "default"]
    decider(0, c.state, NOW + 1)
    decider(1, c.state, NOW + 1)
    assert decider.kept[0][KEPT] is kept and kept.indexes["free", "default"] is index
    loop = PartitionProposer(None, None, decider, "me")   # type: ignore[arg-type]
    revoked(decider, loop, {0})
    assert list(decider.kept) == [1]
