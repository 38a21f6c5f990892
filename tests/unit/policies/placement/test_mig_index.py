"""The MIG index decides exactly as scanning every node did.

The oracle, ``mig_scan.scan_choose_mig``, is a frozen copy of ``heuristics.choose_mig``
as it was before MIG placement was indexed (it looks at every node of the state), kept
only in the tests. On random clusters (MIG-capable and other models, MIG modes mixed, enabled
with instances and disabled, dynamic MIG, GPUs whole, shared and cut, unhealthy GPUs,
cordoned nodes, two pools) the indexed choice must equal the scan's:

* within one statement, as a cycle uses it: after every booking, release, hold and
  lift of MIG slices, nomination, checkpoint and rollback, for every profile, and for
  the MIG jobs placed by a random policy; the index also equals one built afresh;
* through the scheduler: a cycle of every policy decides the same with the scan put back.
"""
from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpusched.core import events as ev
from gpusched.core.mig import PROFILES
from gpusched.core.model import GpuInfo, JobSpec, MigInstance, MigMode, NodeInfo, WorkerResources
from gpusched.policies.memory import CycleMemory
from gpusched.policies.placement.gang import place_gang
from gpusched.policies.placement.heuristics import choose_mig
from gpusched.policies.placement.mig_index import MigIndex
from gpusched.policies.placement.registry import PLACEMENTS, make_placement
from gpusched.policies.scheduler import Scheduler, SchedulerConfig
from gpusched.policies.statement import Statement, tentative
from tests.unit.core.builders import Log, make_node, mig, share, whole
from tests.unit.policies.placement.mig_scan import scan_choose_mig, scanning
from tests.unit.policies.reservation_holds import hold_changes

SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
MODELS = ("A100-80GB", "H100-80GB", "L40S-48GB")
POOLS = ("default", "default", "other")
NAMES = sorted(PROFILES)
STARTS = [(p, s) for p in NAMES for s in PROFILES[p].starts]


def named(choice) -> tuple[str, tuple] | None:
    return None if choice is None else (choice[0].name, choice[1])


# --- random clusters -------------------------------------------------------------------
def random_gpu(data, info: GpuInfo) -> GpuInfo:
    if not info.mig_capable:
        return info
    mode = data.draw(st.sampled_from([MigMode.MIXED, MigMode.MIXED, MigMode.ENABLED, MigMode.DISABLED]))
    instances = ()
    if mode is MigMode.ENABLED:
        picked = data.draw(st.lists(st.sampled_from(STARTS), max_size=3, unique=True))
        instances = tuple(MigInstance(p, s, f"MIG-{info.uuid}-{p}-{s}") for p, s in picked)
    return replace(info, mig_mode=mode, mig_instances=instances)


def random_node(data, i: int) -> NodeInfo:
    d = data.draw
    info = make_node(f"n{i}", gpus=d(st.integers(1, 8)), model=d(st.sampled_from(MODELS)),
                     pool=d(st.sampled_from(POOLS)), cpu=d(st.sampled_from([8_000, 16_000, 64_000])),
                     mem=d(st.sampled_from([8_000, 64_000])))
    return replace(info, gpus=tuple(random_gpu(data, g) for g in info.gpus), dynamic_mig=d(st.booleans()))


def random_request(data) -> WorkerResources:
    d = data.draw
    return WorkerResources(mig_profile=d(st.sampled_from(NAMES + ["3g.40gb"])),
                           cpu_milli=d(st.sampled_from([0, 1_000, 6_000, 16_000])),
                           memory_mib=d(st.sampled_from([0, 1_000, 30_000])),
                           gpu_models=d(st.sampled_from([(), ("A100-80GB",), ("H100-80GB", "L40S-48GB")])))


def random_spec(data, name: str, pool: str) -> JobSpec:
    d = data.draw
    form = d(st.sampled_from(["mig", "mig", "mig", "whole", "share"]))
    if form == "mig":
        res = random_request(data)
    else:
        res = WorkerResources(gpus=d(st.integers(1, 2)) if form == "whole" else 0,
                              gpu_milli=d(st.sampled_from([250, 500])) if form == "share" else 0,
                              cpu_milli=d(st.sampled_from([0, 2_000])), memory_mib=1_000)
    return JobSpec(name=name, team=d(st.sampled_from(["t1", "t2"])), pool=pool,
                   workers=d(st.sampled_from([1, 1, 1, 2])), resources=res)


def busy_slots(data, node: NodeInfo):
    d = data.draw
    index = d(st.integers(0, len(node.gpus) - 1))
    form = d(st.sampled_from(["mig", "mig", "whole", "share", "cpu"]))
    if form == "mig":
        return mig(index, *d(st.sampled_from(STARTS)))
    return {"whole": whole(index), "share": share(index, d(st.sampled_from([300, 700]))), "cpu": ()}[form]


def random_cluster(data) -> Log:
    """Nodes partly used (rejected placements are simply skipped), some GPUs unhealthy,
    some nodes cordoned, and pending jobs: mostly MIG, some whole GPUs and shares."""
    d = data.draw
    nodes = [random_node(data, i) for i in range(d(st.integers(1, 8)))]
    log = Log(*nodes)
    for k in range(d(st.integers(0, 16))):
        node = d(st.sampled_from(nodes))
        slots = busy_slots(data, node)
        res = WorkerResources(
            gpus=len(slots) if slots and not slots[0].mig_profile and slots[0].milli == 1000 else 0,
            gpu_milli=slots[0].milli if slots and not slots[0].mig_profile and slots[0].milli < 1000 else 0,
            mig_profile=slots[0].mig_profile if slots else "",
            cpu_milli=d(st.sampled_from([0, 1_000, 4_000])))
        spec = JobSpec(name="busy", team="t1", pool=node.pool, resources=res)
        if log.submit(f"busy{k}", spec).accepted and not log.place(f"busy{k}", (node.name, slots)).accepted:
            log(ev.JobCancelled, job_id=f"busy{k}")
    for node in nodes:
        if d(st.integers(0, 5)) == 0:
            log(ev.NodeCordoned, node=node.name)
        if d(st.integers(0, 5)) == 0:
            log(ev.GpuHealthChanged, node=node.name, gpu_index=0, healthy=False)
    for k in range(d(st.integers(0, 12))):
        log.submit(f"job{k}", random_spec(data, f"job{k}", d(st.sampled_from(POOLS))))
    return log


# --- within one statement ----------------------------------------------------------------
OPS = ("ask", "place", "place", "release", "hold", "lift", "nominate", "unnominate", "checkpoint", "rollback")


def assert_index_agrees(statement: Statement) -> None:
    """Every profile in both pools: the indexed choice is the scan's, and every index kept
    through the statement's touches equals one built afresh from the nodes."""
    nodes = statement.state.nodes
    for pool in set(POOLS):
        for name in NAMES:
            res = WorkerResources(mig_profile=name, cpu_milli=1_000)
            assert named(choose_mig(statement, nodes, pool, res)) == named(scan_choose_mig(nodes, pool, res))
    for key, view in statement.views.items():
        if isinstance(view, MigIndex):
            fresh = MigIndex(nodes, view.pool, view.profile, view.gpu_weight)
            assert view.where == fresh.where, key
            assert {k: b for k, b in view.buckets.items() if b} == {k: b for k, b in fresh.buckets.items() if b}


@SETTINGS
@given(st.data())
def test_indexed_choice_is_the_scans_within_one_statement(data):
    d = data.draw
    log = random_cluster(data)
    state = log.state
    booked: set[str] = set()
    released: set[str] = set()
    holds: list[tuple] = []
    nominated: list[tuple] = []
    checkpoints: list[tuple] = []
    with tentative(state) as statement:
        assert_index_agrees(statement)
        for _ in range(d(st.integers(1, 20))):
            op = d(st.sampled_from(OPS))
            if op == "ask":
                res, pool = random_request(data), d(st.sampled_from(POOLS))
                assert named(choose_mig(statement, state.nodes, pool, res)) == named(
                    scan_choose_mig(state.nodes, pool, res))
            elif op == "place":
                waiting = sorted(j for j in state.pending if j not in booked)
                if waiting:
                    job = state.jobs[d(st.sampled_from(waiting))]
                    res = job.spec.resources
                    expected = named(scan_choose_mig(state.nodes, job.spec.pool, res)) if res.is_mig else None
                    placed = place_gang(state, job, make_placement(d(st.sampled_from(sorted(PLACEMENTS)))),
                                        statement)
                    if res.is_mig and job.spec.workers == 1:
                        assert ((placed[0].node, placed[0].gpus) if placed else None) == expected
                    if placed:
                        booked.add(job.job_id)
            elif op == "release":
                holding = sorted(j.job_id for j in state.jobs.values()
                                 if j.phase.holds_gpus and j.job_id not in released)
                if holding:
                    job_id = d(st.sampled_from(holding))
                    statement.release(state.jobs[job_id])
                    released.add(job_id)
            elif op == "hold":
                holds.append(hold_changes(state, data))
                statement.hold(*holds[-1])
            elif op == "lift" and holds:
                statement.lift(*holds.pop(d(st.integers(0, len(holds) - 1))))
            elif op == "nominate":
                nominated.append(statement.nominate(d(st.sets(st.sampled_from(sorted(state.nodes))))))
            elif op == "unnominate" and nominated:
                statement.unnominate(nominated.pop(d(st.integers(0, len(nominated) - 1))))
            elif op == "checkpoint":
                checkpoints.append((statement.checkpoint(), set(booked), set(released), list(holds), list(nominated)))
            elif op == "rollback" and checkpoints:
                mark, booked, released, holds, nominated = checkpoints[d(st.integers(0, len(checkpoints) - 1))]
                booked, released, holds, nominated = set(booked), set(released), list(holds), list(nominated)
                checkpoints = [c for c in checkpoints if c[0] <= mark]
                statement.rollback(mark)
            assert_index_agrees(statement)


# --- through the scheduler ---------------------------------------------------------------
def decided(state, policy: str, backfill: bool) -> list[tuple]:
    config = SchedulerConfig(placement=policy, backfill=backfill, max_decisions=50)
    return [(x.job_id, x.workers) for x in Scheduler(config).cycle(state, now=100.0, memory=CycleMemory())]


@SETTINGS
@given(st.data())
def test_a_cycle_decides_as_with_the_scan(data):
    log = random_cluster(data)
    for k in range(data.draw(st.integers(0, 30))):   # a backlog of MIG jobs
        log.submit(f"mig{k}", JobSpec(name="m", team="t2", pool=data.draw(st.sampled_from(POOLS)),
                                      resources=random_request(data)))
    backfill = data.draw(st.booleans())
    for policy in sorted(PLACEMENTS):
        indexed = decided(log.state, policy, backfill)
        with scanning():
            assert decided(log.state, policy, backfill) == indexed, policy


def test_the_scan_put_back_is_what_every_policy_calls():
    """Else the test above would compare the index with itself."""
    log = Log(make_node("a", gpus=1, model="A100-80GB"))
    log.submit("m", JobSpec(name="m", team="t1", resources=WorkerResources(mig_profile="1g")))
    with scanning() as calls:
        for policy in sorted(PLACEMENTS):
            assert decided(log.state, policy, False)
    assert calls == ["1g"] * len(PLACEMENTS)
