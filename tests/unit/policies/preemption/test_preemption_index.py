"""The preemptor's placer views are built once per call and follow the call's tentative
changes (``SearchContext.tentative``): its decisions must be exactly those of views built
afresh for every job (``preemption_oracle``), on random clusters, for every placement
policy, and the state is left as it was. Defragmentation's own kept view (free whole GPUs)
must agree with a scan of the pool.
"""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gpusched.core.digest import digest
from gpusched.core.model import JobPhase
from gpusched.policies.memory import CycleMemory
from gpusched.policies.preemption.decisions import preemption_decisions
from gpusched.policies.preemption.defrag import _blocked, blocked_by_fragmentation, defrag_decisions
from gpusched.policies.preemption.search_context import SearchContext
from tests.unit.policies import preemption_oracle as oracle
from tests.unit.policies.random_preemption import SETTINGS
from tests.unit.policies.preemption.index_clusters import busy_cluster, fragmented_cluster, config_for


@SETTINGS
@given(st.data())
def test_preemption_decisions_are_those_of_fresh_views(data):
    log, now = busy_cluster(data)
    config = config_for(data)
    before = digest(log.state)
    expected = oracle.preemption_decisions(log.state, now, config)
    assert digest(log.state) == before
    assert preemption_decisions(log.state, now, CycleMemory(), config) == expected
    assert digest(log.state) == before


@SETTINGS
@given(st.data())
def test_defrag_plans_are_those_of_fresh_views(data):
    log, now = data.draw(st.sampled_from([busy_cluster, fragmented_cluster]))(data)
    config = config_for(data)
    before = digest(log.state)
    expected = oracle.defrag_decisions(log.state, now, config)
    assert digest(log.state) == before
    assert defrag_decisions(log.state, now, CycleMemory(), config) == expected
    assert digest(log.state) == before


@SETTINGS
@given(st.data())
def test_kept_free_whole_gpus_agree_with_a_scan(data):
    """Defragmentation's kept count of free whole GPUs (``FreeWholeGpus``) says what a scan
    of the pool says, through bookings, released jobs and cordoned nodes of the call."""
    log, now = data.draw(st.sampled_from([busy_cluster, fragmented_cluster]))(data)
    state = log.state
    ctx = SearchContext(state, now, config_for(data), CycleMemory())
    pending = [state.jobs[j] for j in sorted(state.pending)]
    running = [j for j in state.jobs.values() if j.phase in (JobPhase.RUNNING, JobPhase.PLACED)]
    with ctx.tentative() as scratch:
        for _ in range(data.draw(st.integers(1, 6))):
            for job in pending:
                assert _blocked(ctx, job) == blocked_by_fragmentation(state, job)
            step = data.draw(st.sampled_from(["book", "release", "cordon"]))
            if step == "book" and pending:
                job = pending.pop(0)
                placed = ctx.place(job)
                if placed is not None:
                    scratch.book(job, placed)
            elif step == "release" and running:
                scratch.release(running.pop(data.draw(st.integers(0, len(running) - 1))))
            elif step == "cordon":
                scratch.nominate([data.draw(st.sampled_from(sorted(state.nodes)))])
