"""Checking and booking capacity for a placement: the guard of invariant 1.

``check_placement`` is what makes a placement proposal safe to apply: every worker's
node must be ready, in the job's pool, of an allowed model, with the CPU, memory and GPU
(whole, share or MIG slice) still free — counting the other workers of the same gang.
"""
from __future__ import annotations

from collections import defaultdict

from gpusched.core.mig import parse_profile
from gpusched.core.model import GpuSlot, NodeStatus, WorkerAssignment, WorkerResources
from gpusched.core.state import ClusterState, GpuState, JobState


def check_placement(state: ClusterState, job: JobState, workers: tuple[WorkerAssignment, ...]) -> str:
    """Why this placement cannot be applied now, or '' when it can."""
    spec = job.spec
    if sorted(w.worker for w in workers) != list(range(spec.workers)):
        return f"expected workers 0..{spec.workers - 1}"
    cpu: dict[str, int] = defaultdict(int)
    mem: dict[str, int] = defaultdict(int)
    gpu_milli: dict[tuple[str, int], int] = defaultdict(int)
    gpu_mig: dict[tuple[str, int], int] = defaultdict(int)
    for w in workers:
        node = state.nodes.get(w.node)
        if node is None:
            return f"unknown node {w.node}"
        if node.status is not NodeStatus.READY:
            return f"node {w.node} is {node.status.value}"
        if node.info.pool != spec.pool:
            return f"node {w.node} is not in pool {spec.pool}"
        problem = _check_slots(spec.resources, w.gpus, node.gpus)
        if problem:
            return f"node {w.node}: {problem}"
        cpu[w.node] += spec.resources.cpu_milli
        mem[w.node] += spec.resources.memory_mib
        for slot in w.gpus:
            key = (w.node, slot.index)
            if slot.mig_profile:
                mask = parse_profile(slot.mig_profile).mask(slot.mig_start)
                if gpu_mig[key] & mask:
                    return f"MIG slices on {key} given twice"
                gpu_mig[key] |= mask
            else:
                gpu_milli[key] += slot.milli
    for name, need in cpu.items():
        node = state.nodes[name]
        if need > node.free_cpu or mem[name] > node.free_mem:
            return f"node {name} lacks CPU or memory"
    for (name, index), milli in gpu_milli.items():
        gpu = state.nodes[name].gpus[index]
        if gpu.mig_mask or gpu.used_milli + milli > 1000 or not gpu.healthy:
            return f"GPU {name}/{index} lacks {milli} milli"
    for (name, index), mask in gpu_mig.items():
        gpu = state.nodes[name].gpus[index]
        if gpu.used_milli or gpu.mig_mask & mask or not gpu.healthy or not gpu.info.mig_capable:
            return f"GPU {name}/{index} lacks the MIG slices"
    return ""


def _check_slots(res: WorkerResources, slots: tuple[GpuSlot, ...], gpus: list[GpuState]) -> str:
    if len({s.index for s in slots}) != len(slots):
        return "a GPU is listed twice"
    for s in slots:
        if not 0 <= s.index < len(gpus):
            return f"no GPU {s.index}"
        if not res.allows(gpus[s.index].info.model):
            return f"model {gpus[s.index].info.model} not allowed"
    if res.is_mig:
        profile = parse_profile(res.mig_profile)
        ok = (len(slots) == 1 and profile is not None
              and slots[0].mig_profile == res.mig_profile
              and slots[0].mig_start in profile.starts)
        return "" if ok else f"expected one {res.mig_profile} slice at a valid start"
    if res.is_share:
        ok = len(slots) == 1 and slots[0].milli == res.gpu_milli and not slots[0].mig_profile
        return "" if ok else f"expected one GPU share of {res.gpu_milli} milli"
    ok = len(slots) == res.gpus and all(s.milli == 1000 and not s.mig_profile for s in slots)
    return "" if ok else f"expected {res.gpus} whole GPUs"


def _book(state: ClusterState, job: JobState, workers: tuple[WorkerAssignment, ...], sign: int) -> None:
    res = job.spec.resources
    for w in workers:
        node = state.nodes[w.node]
        node.used_cpu += sign * res.cpu_milli
        node.used_mem += sign * res.memory_mib
        for slot in w.gpus:
            gpu = node.gpus[slot.index]
            if slot.mig_profile:
                mask = parse_profile(slot.mig_profile).mask(slot.mig_start)
                gpu.mig_mask = gpu.mig_mask | mask if sign > 0 else gpu.mig_mask & ~mask
            else:
                gpu.used_milli += sign * slot.milli
        if sign > 0:
            node.jobs.add(job.job_id)
        else:
            node.jobs.discard(job.job_id)
    usage = state.team_usage(job.team)
    usage.gpu_milli += sign * res.milli * len(workers)   # these workers, not the whole gang
    usage.cpu_milli += sign * res.cpu_milli * len(workers)
    usage.memory_mib += sign * res.memory_mib * len(workers)
    usage.jobs += sign


def commit(state: ClusterState, job: JobState, workers: tuple[WorkerAssignment, ...]) -> None:
    _book(state, job, workers, +1)


def release(state: ClusterState, job: JobState, workers: tuple[WorkerAssignment, ...]) -> None:
    _book(state, job, workers, -1)
