"""The victim search on the call's index (``victim_index``, ``indexed_search``, ``borrowing``)
decides exactly as the full scan it replaced (``victim_search_oracle``): on random packed
clusters with jobs spread over several nodes (gang victims), several pending jobs of
several teams and classes (priority and quota reclaim in one call), jobs protected by their
exempt time, their preemption budget or a recent reclaim, random guarantees and rules; and
on busy clusters filled by the scheduler. The state is left as it was.
"""
from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from gpusched.core.digest import digest
from gpusched.policies.memory import CycleMemory
from gpusched.policies.preemption.decisions import preemption_decisions, victims_for
from tests.unit.policies.preemption_configs import other_rules
from tests.unit.policies import victim_search_oracle as oracle
from tests.unit.policies.preemption_clusters import BE, HI, NOW, TR, Cluster
from tests.unit.policies.preemption.index_clusters import busy_cluster, packed_cluster, random_rules
from tests.unit.policies.random_preemption import SETTINGS


@SETTINGS
@given(st.data())
def test_decisions_are_those_of_the_full_scan_on_packed_clusters(data):
    c, now = packed_cluster(data)
    config = random_rules(data)
    before = digest(c.state)
    expected = oracle.preemption_decisions(c.state, now, config)
    assert preemption_decisions(c.state, now, CycleMemory(), config) == expected
    assert digest(c.state) == before
    for job_id in sorted(c.state.pending):
        job = c.state.jobs[job_id]
        assert victims_for(c.state, job, now, CycleMemory(), config) == oracle.victims_for(c.state, job, now, config)
    assert digest(c.state) == before


@SETTINGS
@given(st.data())
def test_decisions_are_those_of_the_full_scan_on_busy_clusters(data):
    log, now = busy_cluster(data)
    config = replace(random_rules(data), min_runtime_s=data.draw(st.sampled_from([0.0, 30.0])))
    before = digest(log.state)
    assert preemption_decisions(log.state, now, CycleMemory(), config) == oracle.preemption_decisions(log.state, now, config)
    assert digest(log.state) == before


def test_a_gang_of_four_by_eight_gpus_preempts_a_full_cluster_of_one_gpu_jobs():
    """With no cap on victims (nor on the work lost), as the full scan does: 32 victims on 4 nodes."""
    c = Cluster(nodes=6, gpus=8)
    for n in range(6):
        for g in range(8):
            c.running(f"r{n}-{g}", (f"n{n + 1}", (g,)), started=NOW - 1000 - 10 * (n * 8 + g), priority_class=BE)
    c.pending("gang", gpus=8, workers=4, priority_class=HI)
    got = preemption_decisions(c.state, NOW, CycleMemory(), other_rules())
    assert got == oracle.preemption_decisions(c.state, NOW, other_rules())
    assert len(got) == 1 and len(got[0].victims) == 32 and len(got[0].nodes) == 4


def test_each_decision_looks_at_a_few_nodes_of_a_large_pool(monkeypatch):
    """The point of the index: on a full pool of equal nodes, a one-GPU job's search
    computes the step of a node or two, not of every node."""
    from gpusched.policies.preemption.indexed_search import IndexedSearch
    looked: list[str] = []
    step = IndexedSearch.node_step
    monkeypatch.setattr(IndexedSearch, "node_step", lambda self, name: looked.append(name) or step(self, name))
    c = Cluster(nodes=60, gpus=4)
    for n in range(60):
        for g in range(4):
            c.running(f"r{n}-{g}", (f"n{n + 1}", (g,)), started=NOW - 1000 - (n * 4 + g) % 7, priority_class=BE)
    for p in range(4):
        c.pending(f"p{p}", gpus=1, priority_class=HI)
    got = preemption_decisions(c.state, NOW, CycleMemory(), other_rules())
    assert got == oracle.preemption_decisions(c.state, NOW, other_rules()) and len(got) == 4
    assert len(looked) <= 2 * len(got)


# Many equal costs (``_cluster`` reads the rows).
TIES = [
    ("r0", BE, "a", [("n1", (0,))], 9990.0, None, True),
    ("r1", BE, "a", [("n1", (1,))], 9990.0, 9995.0, True),
    ("r2", BE, "a", [("n1", (2,)), ("n2", (0,))], 9990.0, 9995.0, True),
    ("r3", BE, "a", [("n1", (3,))], 9990.0, None, True),
    ("r4", BE, "a", [("n1", (4,))], 9990.0, None, True),
    ("r5", BE, "a", [("n1", (5,)), ("n2", (1,))], 8500.0, None, True),
    ("r6", BE, "a", [("n1", (6, 7))], 9990.0, 9995.0, False),
    ("r7", BE, "a", [("n2", (2, 3))], 9990.0, None, True),
    ("r8", BE, "a", [("n2", (4, 5))], 9990.0, 9995.0, False),
    ("r9", TR, "a", [("n2", (6,))], 9990.0, None, True),
    ("r10", BE, "a", [("n2", (7,)), ("n3", (0,))], None, None, True),
    ("r11", BE, "a", [("n3", (1,))], None, None, True),
    ("r12", BE, "a", [("n3", (3,))], 9990.0, None, True),
    ("r13", BE, "a", [("n3", (5,))], 9990.0, None, False),
    ("r14", BE, "a", [("n3", (6,))], 9990.0, None, True),
    ("r15", BE, "a", [("n3", (7,))], 9990.0, None, True),
    ("r16", BE, "a", [("n4", (0,))], None, None, False),
    ("r17", BE, "a", [("n4", (2,)), ("n5", (0,))], 9990.0, None, False),
    ("r18", BE, "c", [("n4", (3, 4))], 9990.0, 9950.0, True),
    ("r19", BE, "b", [("n4", (5,)), ("n5", (1,))], 9990.0, None, True),
    ("r20", BE, "c", [("n4", (6,)), ("n5", (2,))], 9900.0, 9950.0, True),
    ("r21", BE, "a", [("n5", (3, 4))], 9990.0, None, True),
    ("r22", TR, "c", [("n5", (5,))], 5000.0, 9950.0, True),
    ("r23", TR, "a", [("n5", (6,))], 9990.0, None, True),
    ("r24", BE, "b", [("n5", (7,))], None, None, True),
]


# A gang's search for which a node's step must be taken before another node of its
# spread victim changes (``IndexedSearch._before_change``); placed jobs: placed then.
SPREAD = [
    ("r0", BE, "a", [("n1", (2,))], None, None, False), ("r1", BE, "a", [("n1", (3,))], None, None, False),
    ("r2", BE, "a", [("n1", (4, 5))], 9990.0, None, True), ("r3", BE, "a", [("n1", (6, 7))], 9990.0, 9995.0, False),
    ("r4", BE, "a", [("n2", (0, 1))], None, None, False), ("r5", BE, "a", [("n2", (3,))], None, None, False),
    ("r6", BE, "a", [("n2", (4,))], None, None, False), ("r7", BE, "a", [("n2", (5,))], None, None, True),
    ("r8", BE, "a", [("n2", (6, 7))], None, None, False), ("r9", BE, "a", [("n3", (0,))], None, None, False),
    ("r10", BE, "a", [("n3", (1,))], None, None, False), ("r11", BE, "a", [("n3", (2,))], 9990.0, None, False),
    ("r12", BE, "a", [("n3", (3,))], None, None, True), ("r13", BE, "a", [("n3", (4, 5))], None, None, False),
    ("r14", BE, "a", [("n3", (6,)), ("n4", (0,))], None, None, True),
    ("r15", BE, "a", [("n3", (7,)), ("n4", (1,))], None, None, False),
    ("r16", BE, "a", [("n4", (2,))], None, None, False), ("r17", BE, "a", [("n4", (3,))], None, None, False),
    ("r18", TR, "a", [("n4", (4, 5))], 9990.0, 9995.0, True), ("r19", BE, "a", [("n4", (6, 7))], None, None, False),
    ("r20", BE, "a", [("n5", (0,)), ("n6", (0,))], 9990.0, 9950.0, True),
    ("r21", TR, "a", [("n5", (2,))], None, None, True), ("r22", BE, "a", [("n5", (3,))], None, None, False),
    ("r23", BE, "a", [("n5", (4,))], None, None, False), ("r24", BE, "a", [("n5", (5, 6))], None, None, False),
    ("r25", BE, "a", [("n5", (7,)), ("n6", (1,))], None, None, False),
    ("r26", BE, "a", [("n6", (2,))], None, None, False), ("r27", TR, "a", [("n6", (3, 4))], None, None, True),
    ("r28", HI, "a", [("n6", (6,))], None, None, False), ("r29", BE, "a", [("n6", (7,))], -9300.0, None, True),
]


def _cluster(nodes: int, jobs: list, gpus: int = 8) -> Cluster:
    """``jobs``: (job, class, team, (node, GPUs) per worker, started (None: placed at 9990
    and not started; -t: placed at t and not started), checkpoint, preemptible)."""
    c = Cluster(nodes=nodes, gpus=gpus)
    for job_id, cls, team, placements, started, ckpt, preemptible in jobs:
        at = 9990.0 if started is None else abs(started)
        c.running(job_id, *placements, started=at, ckpt=ckpt, start=started is not None and started > 0,
                  priority_class=cls, team=team, preemptible=preemptible)
    return c


def test_a_spread_victims_other_node_keeps_the_step_the_full_scan_saw():
    """The full scan computed every node's step before the first release; a node first
    looked at later must see its spread victims' other nodes as they were then."""
    c = _cluster(6, SPREAD)
    c.pending("p0", gpus=2, workers=3, priority_class=TR, team="a")
    c.pending("p1", gpus=1, workers=3, priority_class=HI, team="a")
    config = other_rules(min_runtime_s=0.0, preemption_budget=0)
    got = preemption_decisions(c.state, NOW, CycleMemory(), config)
    assert got == oracle.preemption_decisions(c.state, NOW, config)
    assert [d.for_job for d in got] == ["p0"]


def test_equal_bounds_are_broken_as_the_full_scan_breaks_them():
    """Many victims lose the same GPU-seconds (no exempt time, no budget): the walk must
    not stop at the first equal bound (a node further on may gain more slots, or rank its
    step lower); found by hypothesis when the search stopped at equal bounds."""
    c = _cluster(5, TIES)
    c.pending("p0", gpus=2, priority_class=TR, team="c")
    c.pending("p1", gpus=2, workers=3, priority_class=HI, team="a")
    c.pending("p2", gpus=1, priority_class=HI, team="b")
    c.pending("p3", gpus=2, priority_class=HI, team="c")
    config = other_rules(min_runtime_s=0.0, preemption_budget=0)
    got = preemption_decisions(c.state, NOW, CycleMemory(), config)
    assert got == oracle.preemption_decisions(c.state, NOW, config)
    assert [d.for_job for d in got] == ["p1", "p3", "p0"]


def test_a_spread_victim_gaining_slots_on_two_nodes_wins_a_tie():
    """Two steps of equal rank: the one whose victim frees a slot on each of its two nodes
    wins (it gains more), as in the full scan, though its first node sorts after the other
    step's; the walk looks at spread nodes first among equal bounds."""
    c = _cluster(2, [
        ("r0", BE, "a", [("n1", (0,))], None, None, False),
        ("r1", BE, "a", [("n1", (1, 2))], None, None, True),
        ("r2", BE, "a", [("n1", (3,)), ("n2", (0,))], None, None, True),
        ("r3", BE, "a", [("n2", (1,))], None, None, False),
        ("r4", BE, "a", [("n2", (2, 3))], None, None, False),
    ], gpus=4)
    c.pending("p0", gpus=1, priority_class=HI, team="a")
    config = other_rules(min_runtime_s=0.0, preemption_budget=0)
    got = preemption_decisions(c.state, NOW, CycleMemory(), config)
    assert got == oracle.preemption_decisions(c.state, NOW, config)
    assert [d.victims for d in got] == [("r2",)]


# A gang whose preemption frees GPUs the next pending job could not have freed itself.
FREED_BY_AN_EARLIER_DECISION = [
    ("g", TR, "a", [("n1", (0, 1)), ("n2", (0, 1))], 9990.0, None, True),
    ("b1", BE, "a", [("n1", (2,))], 9990.0, None, True), ("u1", BE, "a", [("n1", (3,))], 9990.0, None, False),
    ("b2", BE, "a", [("n2", (2,))], 9990.0, None, True), ("u2", BE, "a", [("n2", (3,))], 9990.0, None, False),
]


def test_a_later_decision_counts_the_gpus_an_earlier_one_freed():
    """p0 preempts the gang g, which leaves two GPUs free on the node p0 does not take; p1
    (a class no higher than g's) then needs only that node's best-effort job. As the round
    began no node could free three GPUs for p1, so a bound taken from then alone
    (``VictimIndex.most_freeable``) ended its search at once; found by hypothesis."""
    c = _cluster(2, FREED_BY_AN_EARLIER_DECISION, gpus=4)
    c.pending("p0", gpus=2, priority_class=HI, team="a")
    c.pending("p1", gpus=3, priority_class=TR, team="a")
    config = other_rules(min_runtime_s=0.0, preemption_budget=0)
    got = preemption_decisions(c.state, NOW, CycleMemory(), config)
    assert got == oracle.preemption_decisions(c.state, NOW, config)
    assert [d.for_job for d in got] == ["p0", "p1"]
