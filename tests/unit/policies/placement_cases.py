"""Small hand-built clusters for the placement policy tests.

A ``Case`` registers nodes in order, runs jobs already on them (``busy``), submits
pending jobs that only shape the workload mix (``typical``), then asks one policy where
one more job goes, the way the scheduler does (``place_gang`` inside a cycle's statement).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from gpusched.core import events as ev
from gpusched.core.model import GpuSlot, JobSpec, NodeInfo, WorkerResources
from gpusched.policies.statement import tentative
from gpusched.policies.placement.gang import place_gang
from gpusched.policies.placement.registry import make_placement
from tests.unit.core.builders import Log, make_node, make_spec


@dataclass
class Case:
    name: str
    nodes: list[NodeInfo]
    job: JobSpec
    expect: str | None                      # node name, or None: nowhere
    gpus: tuple[int, ...] | None = None     # expected GPU indexes, when it matters
    busy: list[tuple[str, tuple[GpuSlot, ...], int]] = field(default_factory=list)   # node, slots, cpu
    typical: list[JobSpec] = field(default_factory=list)
    cordoned: tuple[str, ...] = ()
    unhealthy: tuple[tuple[str, int], ...] = ()

    def __str__(self) -> str:
        return self.name


def build(case: Case) -> Log:
    log = Log(*case.nodes)
    for i, (node, slots, cpu) in enumerate(case.busy):
        spec = _busy_spec(slots, cpu)
        assert log.submit(f"busy{i}", spec).accepted
        out = log.place(f"busy{i}", (node, slots))
        assert out.accepted, out.reason
    for i, spec in enumerate(case.typical):
        assert log.submit(f"typical{i}", spec).accepted
    for name in case.cordoned:
        assert log(ev.NodeCordoned, node=name).accepted
    for name, index in case.unhealthy:
        assert log(ev.GpuHealthChanged, node=name, gpu_index=index, healthy=False).accepted
    assert log.submit("job", case.job).accepted
    return log


def _busy_spec(slots: tuple[GpuSlot, ...], cpu: int) -> JobSpec:
    if not slots:
        return cpu_job(cpu)
    if slots[0].mig_profile:
        return make_spec("busy", mig=slots[0].mig_profile, cpu=cpu, mem=0)
    if len(slots) == 1 and slots[0].milli < 1000:
        return make_spec("busy", milli=slots[0].milli, cpu=cpu, mem=0)
    return make_spec("busy", gpus=len(slots), cpu=cpu, mem=0)


def cpu_job(cpu: int, mem: int = 0) -> JobSpec:
    return JobSpec(name="cpu", team="busy", resources=WorkerResources(cpu_milli=cpu, memory_mib=mem))


def choose(case: Case, policy: str) -> tuple[str, tuple[int, ...]] | None:
    log = build(case)
    state = log.state
    with tentative(state) as statement:
        placed = place_gang(state, state.jobs["job"], make_placement(policy), statement)
    if placed is None:
        return None
    return placed[0].node, tuple(s.index for s in placed[0].gpus)


def check(case: Case, policy: str) -> None:
    got = choose(case, policy)
    if case.expect is None:
        assert got is None, f"{case}: expected no placement, got {got}"
        return
    assert got is not None, f"{case}: expected {case.expect}, got nothing"
    assert got[0] == case.expect, f"{case}: expected {case.expect}, got {got[0]}"
    if case.gpus is not None:
        assert got[1] == case.gpus, f"{case}: expected GPUs {case.gpus}, got {got[1]}"


def node(name: str, gpus: int = 4, cpu: int = 64_000, mem: int = 256_000, model: str = "H100-80GB",
         labels: tuple[tuple[str, str], ...] = ()) -> NodeInfo:
    return replace(make_node(name, gpus=gpus, model=model, cpu=cpu, mem=mem), labels=labels)
