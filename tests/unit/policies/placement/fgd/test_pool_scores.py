"""The fast FGD and fgd-lookahead (each request's best candidates kept per node,
``placement.fgd.pool_scores``) decide exactly as the policies did when they scored
every feasible node at every decision (``placement_reference``, a frozen copy kept as
the test oracle): the same jobs placed, on the same nodes and GPUs, in every cycle.

Compared through the ``Scheduler`` (whole GPUs, GPU shares, multi-GPU workers, gangs,
MIG, model restrictions, GPU-memory limits on shares, reservations with backfill):

* on the openb pod lists, as the static simulator offers them (every 8th node of the
  trace, the seed's workload, one cycle);
* on random clusters (hypothesis), many nodes alike so that equal nodes share work,
  over several cycles with jobs ending between them.
"""
from __future__ import annotations

import gc
import random
import weakref

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpusched.core import events as ev
from gpusched.core.model import JobSpec, WorkerResources
from gpusched.core.reducer import apply
from gpusched.core.state import ClusterState
from gpusched.policies.memory import CycleMemory
from gpusched.policies.placement.fgd import pool_scores
from gpusched.policies.placement.fgd.policy import Fgd
from gpusched.policies.placement.registry import PLACEMENTS
from gpusched.policies.gpu_fit import pick_gpus
from gpusched.policies.scheduler import Scheduler, SchedulerConfig
from gpusched.policies.statement import Statement
from gpusched.sim import traces
from gpusched.sim.static import workload
from tests.unit.policies import placement_reference as reference
from tests.unit.policies.placement.placement_strategies import MIG_SETUPS, MODELS, jobs_st, with_mig
from tests.unit.core.builders import Log
from tests.unit.policies.placement_cases import node

POLICIES = {"fgd": "reference-fgd", "fgd-lookahead": "reference-fgd-lookahead"}


@pytest.fixture(autouse=True)
def reference_policies(monkeypatch):
    """The oracle, chosen by name as any policy is."""
    monkeypatch.setitem(PLACEMENTS, "reference-fgd", reference.Fgd)
    monkeypatch.setitem(PLACEMENTS, "reference-fgd-lookahead", reference.FgdLookahead)


def decided(state: ClusterState, config: SchedulerConfig) -> list[tuple]:
    return [(d.job_id, d.attempt, d.workers, d.backfilled)
            for d in Scheduler(config).cycle(state, now=0.0, memory=CycleMemory())]


def assert_same(state: ClusterState, policy: str, **config) -> list[tuple]:
    fast = decided(state, SchedulerConfig(placement=policy, **config))
    oracle = decided(state, SchedulerConfig(placement=POLICIES[policy], **config))
    assert fast == oracle
    return fast


# --- the openb pod lists ----------------------------------------------------------------
def openb_state(pod_list: str, seed: int, stride: int) -> ClusterState:
    """The static simulator's state for ``seed`` (``static.pack``), on every
    ``stride``-th node of the trace."""
    nodes = traces.load_nodes()[::stride]
    tasks = traces.load_tasks(pod_list)
    arrivals = workload(tasks, sum(len(n.gpus) for n in nodes) * 1000, seed)
    state = ClusterState()
    for i, info in enumerate(random.Random(f"nodes:{seed}").sample(nodes, len(nodes))):
        apply(state, ev.NodeRegistered(event_id=f"node-{i}", node=info))
    for i, task in enumerate(arrivals):
        job_id = f"{pod_list}-{seed}-{i:06d}"
        apply(state, ev.JobSubmitted(event_id=f"submit-{job_id}", job_id=job_id, spec=task.spec(job_id)))
    return state


@pytest.mark.skipif(not (traces.TRACE_DIR / traces.NODE_LIST).exists(), reason="no openb trace")
@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize("pod_list", traces.POD_LISTS)
def test_same_decisions_on_the_openb_lists(pod_list, policy):
    state = openb_state(pod_list, seed=42, stride=8)
    placed = assert_same(state, policy, queue="fifo", max_decisions=len(state.pending))
    assert len(placed) > 500 and len(placed) < len(state.pending)   # the cluster fills up


# --- random clusters --------------------------------------------------------------------
# A few node templates, each repeated: equal nodes are where sharing work could go wrong.
templates_st = st.lists(
    st.tuples(st.integers(0, 8), st.sampled_from(MODELS), st.sampled_from([8000, 32_000, 64_000]),
              st.sampled_from([16_000, 128_000]), st.sampled_from(MIG_SETUPS), st.integers(1, 8)),
    min_size=1, max_size=4)


def alike_cluster(templates, rng: random.Random) -> Log:
    infos = [with_mig(node(f"t{t}-{k}", gpus=g, model=m, cpu=cpu, mem=mem, labels=(("rack", f"r{k % 2}"),)), setup)
             for t, (g, m, cpu, mem, setup, copies) in enumerate(templates) for k in range(copies)]
    rng.shuffle(infos)
    return Log(*infos)


@pytest.mark.parametrize("policy", sorted(POLICIES))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(templates=templates_st, rounds=st.lists(jobs_st, min_size=1, max_size=4),
       backfill=st.booleans(), rng=st.randoms(use_true_random=False))
def test_same_decisions_on_random_clusters(policy, templates, rounds, backfill, rng):
    log = alike_cluster(templates, rng)
    count = 0
    for jobs in rounds:
        for res, workers in jobs:
            spec = JobSpec(name=f"j{count}", team=f"t{count % 2}", workers=workers, resources=res)
            assert log.submit(f"j{count}", spec).accepted
            count += 1
        for job_id, attempt, workers, _ in assert_same(log.state, policy, queue="fifo", backfill=backfill):
            assert log(ev.JobPlaced, job_id=job_id, attempt=attempt, workers=workers).accepted
        for job in [j for j in log.state.jobs.values() if j.phase.holds_gpus]:
            if rng.random() < 0.4:   # some end: the next round places into a used cluster
                assert log(ev.JobCancelled, job_id=job.job_id).accepted
                log.stopped(job.job_id)


# How many rows (groups of equal rows, changed rows) the fast policies score one by one in
# plain Python before numpy takes over: the default, and low bounds that send a pass of a
# few rows to numpy, so that both paths decide alike.
FEW_ROWS = pytest.mark.parametrize("few_rows", [None, 0, 3])


def with_few_rows(monkeypatch, few_rows: int | None) -> None:
    if few_rows is not None:
        monkeypatch.setattr(pool_scores, "FEW_ROWS", few_rows)


@FEW_ROWS
def test_many_equal_nodes_fill_in_registration_order(monkeypatch, few_rows):
    """The bench's shape in small: 40 equal nodes, a long queue of the openb mix."""
    with_few_rows(monkeypatch, few_rows)
    rng = random.Random(5)
    log = Log(*(node(f"n{i:02d}", gpus=8, cpu=128_000, mem=1_048_576) for i in range(40)))
    for i in range(600):
        x = rng.random()
        if x < 0.4:
            res = dict(milli=rng.choice((110, 230, 460, 470, 550, 810)))
        elif x < 0.85:
            res = dict(gpus=1)
        else:
            res = dict(gpus=rng.choice((2, 4, 8)))
        spec = JobSpec(name=f"j{i}", team="t", resources=_resources(cpu=rng.choice((2000, 8000, 16_000)), **res))
        assert log.submit(f"j{i:04d}", spec).accepted
    for policy in sorted(POLICIES):
        placed = assert_same(log.state, policy, queue="fifo", max_decisions=600)
        assert 200 < len(placed) < 600


@pytest.mark.parametrize("long_gap", [0, 7])
def test_requests_asked_again_after_many_changes_decide_alike(monkeypatch, long_gap):
    """A request asked again after more than ``LONG_GAP`` changes reads the rows changed
    since from the view's stamps (``PoolScores.since``), not from the list of changes."""
    monkeypatch.setattr(pool_scores, "LONG_GAP", long_gap)
    rng = random.Random(7)
    log = Log(*(node(f"n{i:02d}", gpus=8, cpu=128_000, mem=1_048_576) for i in range(12)))
    for i in range(150):
        res = rng.choice([dict(milli=rng.choice((110, 470, 810))), dict(gpus=1), dict(gpus=rng.choice((2, 4)))])
        spec = JobSpec(name=f"j{i}", team="t", resources=_resources(cpu=rng.choice((2000, 16_000)), **res))
        assert log.submit(f"j{i:04d}", spec).accepted
    for policy in sorted(POLICIES):
        assert 50 < len(assert_same(log.state, policy, queue="fifo")) < 150


@pytest.mark.parametrize("few_rows", [None, 0])
def test_the_rows_changed_since_a_place_are_those_listed_after_it(monkeypatch, few_rows):
    """``PoolScores.since(seen)``: the rows of ``changed[seen:]``, from either path (the
    list's slice, the stamps), after syncs of one row each or of many (numpy's path)."""
    monkeypatch.setattr(pool_scores, "LONG_GAP", 4)
    if few_rows is not None:
        monkeypatch.setattr(pool_scores, "FEW_ROWS", few_rows)
    log = Log(*(node(f"n{i}", gpus=8, cpu=128_000, mem=1_048_576) for i in range(6)))
    statement = Statement(log.state)
    view = Fgd().view(log.state, statement, log.state.nodes["n0"].info.pool)
    rng, res = random.Random(3), _resources(cpu=1000, milli=110)
    for _ in range(30):
        for name in rng.sample(sorted(log.state.nodes), rng.randint(1, 3)):
            node_state = log.state.nodes[name]
            statement.take(node_state, res, pick_gpus(node_state, res))
        view.sync()
    assert len(view.changed) > 30
    for seen in range(len(view.changed) + 1):
        assert sorted(set(view.since(seen))) == sorted(set(view.changed[seen:]))
    statement.close()


@FEW_ROWS
def test_shares_asking_for_gpu_memory_take_the_first_candidate(monkeypatch, few_rows):
    """Shares that ask for GPU memory, on equal nodes: GPUs end up with equal free milli
    but unequal free memory. The oracle walks past candidates whose GPU lacks the memory
    (the node refuses them); the fast policies see GPU memory in their arrays, so their
    first candidate is taken, never a walk over every candidate (``scan``), and they
    decide the same."""
    with_few_rows(monkeypatch, few_rows)
    refused = []
    oracle_take = reference.take

    def counting_take(*args):
        slots = oracle_take(*args)
        if slots is None:
            refused.append(args)
        return slots

    monkeypatch.setattr(reference, "take", counting_take)
    monkeypatch.setattr(Fgd, "scan", lambda *args: pytest.fail("the fast policy walked every candidate"))
    rng = random.Random(7)
    log = Log(*(node(f"n{i:02d}", gpus=4, cpu=128_000, mem=1_048_576) for i in range(12)))
    for i in range(300):
        res = WorkerResources(gpu_milli=rng.choice((250, 500)), gpu_memory_mib=rng.choice((0, 8_000, 30_000, 60_000)),
                              cpu_milli=1000, memory_mib=1000)
        assert log.submit(f"j{i:04d}", JobSpec(name=f"j{i}", team="t", resources=res)).accepted
    for policy in sorted(POLICIES):
        placed = assert_same(log.state, policy, queue="fifo", max_decisions=300)
        assert 50 < len(placed) < 300
    assert refused   # the case is met: a candidate's GPU lacked the memory


@FEW_ROWS
def test_shares_asking_for_gpu_memory_on_a_used_cluster(monkeypatch, few_rows):
    """The cycle's view starts on nodes whose GPUs are equal in free milli but not in
    free GPU memory: shares that ask for GPU memory score one node of each group alike
    in both (``PoolScores.memory_group``), the others one of each group alike in milli."""
    with_few_rows(monkeypatch, few_rows)
    rng = random.Random(11)
    log = Log(*(node(f"n{i:02d}", gpus=4, cpu=128_000, mem=1_048_576) for i in range(12)))
    for i in range(24):   # a first round: the same milli, different GPU memory
        res = WorkerResources(gpu_milli=500, gpu_memory_mib=rng.choice((1_000, 40_000)), cpu_milli=1000,
                              memory_mib=1000)
        assert log.submit(f"a{i:03d}", JobSpec(name=f"a{i}", team="t", resources=res)).accepted
    for job_id, attempt, workers, _ in decided(log.state, SchedulerConfig(placement="fgd", queue="fifo")):
        assert log(ev.JobPlaced, job_id=job_id, attempt=attempt, workers=workers).accepted
    for i in range(200):
        res = WorkerResources(gpu_milli=rng.choice((250, 500)), gpu_memory_mib=rng.choice((0, 20_000, 38_000)),
                              cpu_milli=1000, memory_mib=1000)
        assert log.submit(f"j{i:04d}", JobSpec(name=f"j{i}", team="t", resources=res)).accepted
    for policy in sorted(POLICIES):
        placed = assert_same(log.state, policy, queue="fifo", max_decisions=200)
        assert 20 < len(placed) < 200


def _resources(cpu: int, gpus: int = 0, milli: int = 0) -> WorkerResources:
    return WorkerResources(gpus=gpus, gpu_milli=milli, cpu_milli=cpu, memory_mib=4 * cpu)


# --- capacity that grows mid-cycle ---------------------------------------------------------
def _take_all(statement: Statement, node_state):
    """Make every GPU of the node look taken: booked (``take``) or held for a reservation."""
    res = WorkerResources(gpus=len(node_state.gpus), cpu_milli=1000, memory_mib=1000)
    slots = pick_gpus(node_state, res)
    statement.take(node_state, res, slots)
    return lambda: statement.give(node_state, res, slots)


def _hold_all(statement: Statement, node_state):
    changes = tuple((g, "used_milli", 1000) for g in node_state.gpus)
    statement.hold(changes, (node_state.name,))
    return lambda: statement.lift(changes, (node_state.name,))


@pytest.mark.parametrize("free_again", [_take_all, _hold_all], ids=["released", "hold-lifted"])
@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_a_row_whose_capacity_grew_is_scored_again(policy, free_again):
    """A request scored while a node was full keeps no candidate there; once the node's
    GPUs are free again (a booking released, a reservation's hold lifted) the next
    decision must see it: three equal idle nodes, so the first registered wins."""
    log = Log(*(node(f"n{i}", gpus=8, cpu=128_000, mem=1_048_576) for i in range(3)))
    for job_id, res in [("share", _resources(cpu=1000, milli=470)), ("whole", _resources(cpu=1000, gpus=2))]:
        assert log.submit(job_id, JobSpec(name=job_id, team="t", resources=res)).accepted
    for job_id in ("share", "whole"):
        job = log.state.jobs[job_id]
        res = job.spec.resources
        chosen = []
        for placement in (PLACEMENTS[policy](), PLACEMENTS[POLICIES[policy]]()):
            statement = Statement(log.state)
            undo = free_again(statement, log.state.nodes["n0"])
            assert placement.choose(log.state, statement, job, res)[0].name == "n1"   # n0 is full
            undo()
            chosen.append(placement.choose(log.state, statement, job, res)[0].name)
            statement.close()
        assert chosen == ["n0", "n0"]


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_a_cycles_view_is_freed_when_the_statement_drops_it(policy):
    """The view, its row scorer and its memos are freed when the statement closes, by
    reference counting: none is left in a reference cycle for the cyclic GC to find
    (a full collection then paid, in some later cycle, for every object of them)."""
    log = Log(*(node(f"n{i}", gpus=8, cpu=128_000, mem=1_048_576) for i in range(3)))
    for i, res in enumerate([_resources(cpu=1000, milli=470), _resources(cpu=1000, gpus=2), _resources(cpu=2000)]):
        assert log.submit(f"j{i}", JobSpec(name=f"j{i}", team="t", resources=res)).accepted
    placement = PLACEMENTS[policy]()
    gc.disable()
    try:
        statement = Statement(log.state)
        for job in log.state.jobs.values():
            node_state, slots = placement.choose(log.state, statement, job, job.spec.resources)
        views = [weakref.ref(view) for view in statement.views.values()]
        views += [weakref.ref(view.scorer) for view in statement.views.values() if hasattr(view, "scorer")]
        assert len(views) == 3   # the arrays, the FGD view and its scorer
        del node_state, slots
        statement.close()
        assert [view() for view in views] == [None] * 3
    finally:
        gc.enable()


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_nodes_alike_but_for_free_memory_are_each_checked_for_it(policy):
    """Two T4 nodes equal in what a score reads (free GPU, CPU, model, idleness) but not in
    free memory: the first scoring of a request scores one node of the group, and must
    not let that node's lack of memory stand for the other's; found by hypothesis."""
    templates = [(1, "H100-80GB", 8000, 16_000, "mixed", 1), (1, "T4-16GB", 32_000, 16_000, "mixed", 1),
                 (1, "T4-16GB", 32_000, 128_000, "mixed", 1)]
    log = alike_cluster(templates, random.Random(1))
    res = WorkerResources(gpus=1, cpu_milli=16_000, memory_mib=32_000)
    assert log.submit("j0", JobSpec(name="j0", team="t0", workers=1, resources=res)).accepted
    placed = assert_same(log.state, policy, queue="fifo")
    assert [w.node for _, _, workers, _ in placed for w in workers] == ["t2-0"]
