"""Properties of the queue orders and of the scheduler + reducer on random workloads.

* every order is a permutation of the pending set, the same for the same inputs (and
  for the same jobs listed in another order);
* with fair share, aging and EASY backfill, a job that has aged waits at most one
  runtime bound ``D`` per job ahead of it: wait <= aging_s + (k + 1) * D, where k counts
  the jobs submitted before it that were still waiting when it aged;
* no placement ever takes a team or an org over its limit;
* the cycle's fair-share tiers, its guarantee hold and the preemptor classify every job
  alike: claimed against its team's guarantee, or borrowed (``claims_guarantee``).

Workloads run through the dynamic simulator: the production reducer and scheduler.
"""
from __future__ import annotations

import copy

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpusched.core import events as ev
from gpusched.core.model import JobSpec, WorkerResources
from gpusched.core.priority import PRIORITY_CLASSES
from gpusched.core.reducer import apply
from gpusched.core.state import ClusterState
from gpusched.policies.memory import CycleMemory
from gpusched.policies.preemption.search_context import SearchContext
from gpusched.policies.preemption.victim_rules import PreemptionConfig
from gpusched.policies.queueing.fairshare import QueueContext, tier_of
from gpusched.policies.queueing.guarantee_hold import GuaranteeHold
from gpusched.policies.queueing.order import QUEUE_ORDERS
from gpusched.policies.queueing.quota import OrgQuota, QueueTree, TeamQuota
from gpusched.policies.scheduler import Scheduler, SchedulerConfig
from gpusched.policies.queueing.usage import Demand
from gpusched.sim.dynamic import DynamicSimulator
from gpusched.sim.workload import Arrival, Workload
from tests.unit.core.builders import make_node

TEAMS = ("a", "b", "c")
ORG_OF = {"a": "x", "b": "x", "c": "y"}
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def worker_shapes(draw, nodes: int) -> tuple[int, WorkerResources]:
    """(workers, resources) of a job that fits an empty cluster of ``nodes`` 8-GPU nodes."""
    kind = draw(st.sampled_from(["whole", "whole", "share", "gang"]))
    cpu = draw(st.sampled_from([0, 4_000, 16_000]))
    if kind == "share":
        return 1, WorkerResources(gpu_milli=draw(st.sampled_from([200, 500, 700])), cpu_milli=cpu)
    if kind == "gang":
        return 2, WorkerResources(gpus=draw(st.sampled_from([4, 8] if nodes > 1 else [4])), cpu_milli=cpu)
    return 1, WorkerResources(gpus=draw(st.integers(1, 8)), cpu_milli=cpu)


@st.composite
def workloads(draw, max_jobs: int = 30, quotas: QueueTree | None = None) -> Workload:
    nodes = tuple(make_node(f"n{i}", gpus=8, cpu=64_000, mem=512_000) for i in range(draw(st.integers(1, 3))))
    arrivals = []
    for i in range(draw(st.integers(1, max_jobs))):
        workers, res = draw(worker_shapes(len(nodes)))
        runtime = float(draw(st.integers(10, 1_000)))
        team = draw(st.sampled_from(TEAMS))
        spec = JobSpec(name=f"j{i:03d}", team=team, org=ORG_OF[team], workers=workers, resources=res,
                       priority_class=draw(st.sampled_from(sorted(PRIORITY_CLASSES))),
                       max_runtime_s=runtime, simulated_duration_s=runtime)
        arrivals.append(Arrival(float(draw(st.integers(0, 2_000))), spec.name, spec))
    arrivals.sort(key=lambda a: (a.time, a.job_id))
    return Workload("random", nodes, tuple(arrivals), quotas or QueueTree())


@st.composite
def quota_trees(draw) -> QueueTree:
    limit = st.one_of(st.none(), st.integers(4, 24))

    def team() -> TeamQuota:
        cap = draw(limit)
        guaranteed = draw(st.integers(0, cap if cap is not None else 16))
        return TeamQuota(guaranteed, cap, draw(st.sampled_from([0.5, 1.0, 2.0])))

    return QueueTree(orgs={
        "x": OrgQuota(teams={"a": team(), "b": team()}, limit_gpus=draw(limit)),
        "y": OrgQuota(teams={"c": team()}, limit_gpus=draw(limit)),
    })


# --- orders ---------------------------------------------------------------------------
@st.composite
def queue_states(draw):
    """A state with some jobs placed (by a fifo cycle) and others pending, plus a context."""
    wl = draw(workloads(max_jobs=25))
    state = ClusterState()
    for node in wl.nodes:
        apply(state, ev.NodeRegistered(event_id=f"node:{node.name}", node=node))
    for a in wl.arrivals:
        apply(state, ev.JobSubmitted(event_id=a.job_id, time=a.time, job_id=a.job_id, spec=a.spec))
    placed = draw(st.integers(0, len(wl.arrivals)))
    for d in Scheduler(SchedulerConfig(queue="fifo", max_decisions=max(placed, 1))).cycle(state, 0.0, CycleMemory())[:placed]:
        apply(state, ev.JobPlaced(event_id=f"p:{d.job_id}", job_id=d.job_id, attempt=0, workers=d.workers))
    decayed = {t: Demand(draw(st.integers(0, 16_000)), draw(st.integers(0, 64_000)), 0.0)
               for t in draw(st.sets(st.sampled_from(TEAMS)))}
    context = QueueContext(draw(quota_trees()), decayed, float(draw(st.sampled_from([0, 500, 10**9]))))
    return state, context, float(draw(st.integers(0, 5_000)))


@SETTINGS
@given(queue_states())
def test_orders_are_deterministic_permutations_of_the_pending_set(case):
    state, context, now = case
    pending = [state.jobs[j] for j in state.pending]
    for name, order in sorted(QUEUE_ORDERS.items()):
        ids = [j.job_id for j in order(state, pending, now, context)]
        assert sorted(ids) == sorted(state.pending), name
        assert [j.job_id for j in order(state, list(reversed(pending)), now, context)] == ids, name
        twin = copy.deepcopy(state)
        assert [j.job_id for j in order(twin, [twin.jobs[j] for j in twin.pending], now, context)] == ids, name


# --- aging bounds the wait ------------------------------------------------------------
@SETTINGS
@given(workloads(), st.sampled_from([0.0, 300.0, 3_600.0]), st.sampled_from([100.0, 1_000.0]))
def test_aging_bounds_the_wait(workload, half_life, aging_s):
    config = SchedulerConfig(queue="fair-share", backfill=True, half_life_s=half_life, aging_s=aging_s)
    result = DynamicSimulator(workload, config).run()
    jobs = sorted(result.jobs, key=lambda j: (j.submitted_at, j.job_id))     # = submission order
    bound_d = max(a.spec.max_runtime_s for a in workload.arrivals)
    assert all(j.started_at is not None for j in jobs)
    for i, job in enumerate(jobs):
        aged_at = job.submitted_at + aging_s
        ahead = sum(1 for earlier in jobs[:i] if earlier.started_at > aged_at)
        assert job.started_at - job.submitted_at <= aging_s + (ahead + 1) * bound_d + 1e-6, job


# --- limits ---------------------------------------------------------------------------
@SETTINGS
@given(st.data())
def test_limits_are_never_exceeded(data):
    tree = data.draw(quota_trees())
    workload = data.draw(workloads(quotas=tree))
    config = SchedulerConfig(queue=data.draw(st.sampled_from(sorted(QUEUE_ORDERS))), quotas=tree,
                             backfill=data.draw(st.booleans()))
    result = DynamicSimulator(workload, config).run()
    teams = result.teams
    for sample in result.samples:
        held = dict(zip(teams, sample.team_milli))
        for team, milli in held.items():
            assert milli <= tree.team_quota(team).limit_milli, (team, sample)
        for org in ("x", "y"):
            assert sum(held.get(t, 0) for t in tree.teams_of(org)) <= tree.org_quota(org).limit_milli
    # and they bind only where they must: a job that never ran is larger than a limit
    for job in result.jobs:
        if job.started_at is None:
            quota = tree.team_quota(job.team)
            assert job.milli > min(quota.limit_milli, tree.org_quota(ORG_OF[job.team]).limit_milli), job


# --- one view of who borrows ------------------------------------------------------------
@SETTINGS
@given(queue_states())
def test_the_cycle_and_the_preemptor_classify_every_team_alike(case):
    state, context, now = case
    tree = context.tree
    preemptor = SearchContext(state, now, PreemptionConfig(quotas=tree), CycleMemory())
    hold = GuaranteeHold(state, tree, [], now)
    for job_id in state.pending:
        job = state.jobs[job_id]
        claimed = tier_of(state, job, tree) == 0          # the cycle ranks it as its team's guarantee
        assert preemptor.may_reclaim(job) is claimed, job   # the preemptor reclaims for it
        assert hold.borrows(job) is not claimed, job        # the hold does not count it a borrower
