"""Checking and booking capacity for a placement: the guard of invariant 1.

``check_placement`` is what makes a placement proposal safe to apply: every worker's
node must be ready, in the job's pool, of an allowed model, with the CPU, memory and GPU
(whole, share or MIG slice) still free — counting the other workers of the same gang.

Both functions run once per placement (and ``release`` once per ended attempt) on the
replay hot path, so they avoid per-call allocations where the common case allows: a
placement whose workers are all on different nodes — every single-worker job, and most
gangs — needs no per-node totals. Gangs with several workers on one node take the
general path, which sums what the workers ask of each node and GPU. Both paths check in
the same order and give the same reasons.

Whether a GPU can take a whole GPU, a share or a MIG slice is decided by one rule, the
``GpuState`` methods (``fits_whole``, ``fits_share``, ``fits_mig``): placement chooses
with them and every check path here verifies with them, so what a policy chooses is
exactly what the reducer accepts.
"""
from __future__ import annotations

from collections import defaultdict

from gpusched.core.mig import parse_profile, slice_mask
from gpusched.core.model import GpuSlot, JobSpec, WorkerAssignment, WorkerResources
from gpusched.core.topology import NO_REQUEST, placement_violation, pool_levels
from gpusched.core.state import ClusterState, GpuState, JobState, NodeState, TeamLedger, Usage


def check_placement(state: ClusterState, job: JobState, workers: tuple[WorkerAssignment, ...]) -> str:
    """Why this placement cannot be applied now, or '' when it can."""
    spec = job.spec
    if not _numbered(workers, spec.workers):
        return f"expected workers 0..{spec.workers - 1}"
    if len(workers) == 1:
        return _check_one(state, spec, workers[0])
    if len({w.node for w in workers}) == len(workers):
        problem = _check_on_distinct_nodes(state, spec, workers)
    else:
        problem = _check_sharing_nodes(state, spec, workers)
    if problem or spec.topology == NO_REQUEST:
        return problem
    infos = {w.node: state.nodes[w.node].info for w in workers}
    return placement_violation(spec, infos, pool_levels(state.pool_topology, spec.pool), workers)


def _numbered(workers: tuple[WorkerAssignment, ...], count: int) -> bool:
    """Workers are exactly 0..count-1 (in any order)."""
    if count == 1:   # the common case, without building and sorting lists
        return len(workers) == 1 and workers[0].worker == 0
    return sorted(w.worker for w in workers) == list(range(count))


def _unusable(node: NodeState, name: str, pool: str) -> str:
    if not node.schedulable:   # status READY
        return f"node {name} is {node.status.value}"
    if node.info.pool != pool:
        return f"node {name} is not in pool {pool}"
    return ""


def _check_one(state: ClusterState, spec: JobSpec, w: WorkerAssignment) -> str:
    """``_check_on_distinct_nodes`` for a single worker (most jobs): the same checks in
    the same order, without the per-worker lists."""
    res = spec.resources
    node = state.nodes.get(w.node)
    if node is None:
        return f"unknown node {w.node}"
    problem = _unusable(node, w.node, spec.pool)
    if problem:
        return problem
    gpus = node.gpus
    problem = _check_slots(res, w.gpus, gpus)
    if problem:
        return f"node {w.node}: {problem}"
    info = node.info
    if res.cpu_milli > info.cpu_milli - node.used_cpu or res.memory_mib > info.memory_mib - node.used_mem:
        return f"node {w.node} lacks CPU or memory"
    return _slots_lack(w, gpus, _share_memory(res))


def _share_memory(res: WorkerResources) -> int:
    """GPU memory each slot of ``res`` books: a share's request, nothing for other forms."""
    return res.gpu_memory_mib if res.gpu_milli > 0 and res.gpus == 0 else 0   # res.is_share


def _mig_refused(gpu: GpuState, text: str, start: int) -> bool:
    """A MIG slot the GPU cannot take now, by the rule placement chooses with."""
    profile = parse_profile(text)
    if profile is None:
        raise ValueError(f"unknown MIG profile {text!r}")
    return not gpu.fits_mig(profile, start)


def _milli_refused(gpu: GpuState, milli: int, memory: int) -> bool:
    """Whole-GPU or share milli (and a share's GPU memory) the GPU cannot take now, by the
    rule placement chooses with (a whole GPU is a share of 1000 milli)."""
    return not gpu.fits_share(milli, memory)


def _check_on_distinct_nodes(state: ClusterState, spec: JobSpec, workers: tuple[WorkerAssignment, ...]) -> str:
    """No two workers share a node, so no two slots share a GPU: each worker can be
    checked against its node's free capacity alone. Same phases as the general path."""
    res = spec.resources
    nodes: list[NodeState] = []
    for w in workers:
        node = state.nodes.get(w.node)
        if node is None:
            return f"unknown node {w.node}"
        problem = _unusable(node, w.node, spec.pool)
        if problem:
            return problem
        problem = _check_slots(res, w.gpus, node.gpus)
        if problem:
            return f"node {w.node}: {problem}"
        nodes.append(node)
    for w, node in zip(workers, nodes):
        if res.cpu_milli > node.free_cpu or res.memory_mib > node.free_mem:
            return f"node {w.node} lacks CPU or memory"
    memory = _share_memory(res)
    for w, node in zip(workers, nodes):
        problem = _slots_lack(w, node.gpus, memory)
        if problem:
            return problem
    return ""


def _slots_lack(w: WorkerAssignment, gpus: list[GpuState], memory: int) -> str:
    """Which of the worker's slots its GPUs no longer have room for, or ''. Only after
    _check_slots passed, so every slot is of the job's kind: MIG slices or GPU milli."""
    for slot in w.gpus:
        gpu = gpus[slot.index]
        if slot.mig_profile:
            if _mig_refused(gpu, slot.mig_profile, slot.mig_start):
                return f"GPU {w.node}/{slot.index} lacks the MIG slices"
        elif _milli_refused(gpu, slot.milli, memory):
            return f"GPU {w.node}/{slot.index} lacks {slot.milli} milli"
    return ""


def _check_sharing_nodes(state: ClusterState, spec: JobSpec, workers: tuple[WorkerAssignment, ...]) -> str:
    """Gang members share nodes (and maybe GPUs): sum what they ask of each first."""
    cpu: dict[str, int] = defaultdict(int)
    mem: dict[str, int] = defaultdict(int)
    gpu_milli: dict[tuple[str, int], int] = defaultdict(int)
    gpu_mem: dict[tuple[str, int], int] = defaultdict(int)
    gpu_mig: dict[tuple[str, int], int] = defaultdict(int)
    starts: dict[tuple[str, int], list[tuple[str, int]]] = defaultdict(list)
    memory = _share_memory(spec.resources)
    for w in workers:
        node = state.nodes.get(w.node)
        if node is None:
            return f"unknown node {w.node}"
        problem = _unusable(node, w.node, spec.pool)
        if problem:
            return problem
        problem = _check_slots(spec.resources, w.gpus, node.gpus)
        if problem:
            return f"node {w.node}: {problem}"
        cpu[w.node] += spec.resources.cpu_milli
        mem[w.node] += spec.resources.memory_mib
        for slot in w.gpus:
            key = (w.node, slot.index)
            if slot.mig_profile:
                mask = slice_mask(slot.mig_profile, slot.mig_start)
                if gpu_mig[key] & mask:
                    return f"MIG slices on {key} given twice"
                gpu_mig[key] |= mask
                starts[key].append((slot.mig_profile, slot.mig_start))
            else:
                gpu_milli[key] += slot.milli
                gpu_mem[key] += memory
    for name, need in cpu.items():
        node = state.nodes[name]
        if need > node.free_cpu or mem[name] > node.free_mem:
            return f"node {name} lacks CPU or memory"
    for (name, index), milli in gpu_milli.items():
        gpu = state.nodes[name].gpus[index]
        if _milli_refused(gpu, milli, gpu_mem[(name, index)]):
            return f"GPU {name}/{index} lacks {milli} milli"
    for (name, index), mask in gpu_mig.items():
        gpu = state.nodes[name].gpus[index]
        if gpu.mig_mask & mask or any(_mig_refused(gpu, p, s) for p, s in starts[(name, index)]):
            return f"GPU {name}/{index} lacks the MIG slices"
    return ""


def _check_slots(res: WorkerResources, slots: tuple[GpuSlot, ...], gpus: list[GpuState]) -> str:
    if len(slots) > 1 and len({s.index for s in slots}) != len(slots):
        return "a GPU is listed twice"
    models = res.gpu_models
    for s in slots:
        if not 0 <= s.index < len(gpus):
            return f"no GPU {s.index}"
        if models and gpus[s.index].info.model not in models:   # res.allows(), inlined
            return f"model {gpus[s.index].info.model} not allowed"
    if res.mig_profile:   # res.is_mig
        profile = parse_profile(res.mig_profile)
        ok = (len(slots) == 1 and profile is not None
              and slots[0].mig_profile == res.mig_profile
              and slots[0].mig_start in profile.starts)
        return "" if ok else f"expected one {res.mig_profile} slice at a valid start"
    if res.is_share:
        ok = len(slots) == 1 and slots[0].milli == res.gpu_milli and not slots[0].mig_profile
        return "" if ok else f"expected one GPU share of {res.gpu_milli} milli"
    if len(slots) == res.gpus:
        for s in slots:   # a loop, not all(<generator>): this runs for every placement
            if s.milli != 1000 or s.mig_profile:
                break
        else:
            return ""
    return f"expected {res.gpus} whole GPUs"


def book_resources(node: NodeState, res: WorkerResources, slots: tuple[GpuSlot, ...], sign: int) -> None:
    """Add (sign +1) or remove (-1) one worker's CPU, memory and GPU slots on ``node``."""
    node.used_cpu += sign * res.cpu_milli
    node.used_mem += sign * res.memory_mib
    memory = sign * _share_memory(res)
    gpus = node.gpus
    for slot in slots:
        gpu = gpus[slot.index]
        if slot.mig_profile:
            mask = slice_mask(slot.mig_profile, slot.mig_start)
            gpu.mig_mask = gpu.mig_mask | mask if sign > 0 else gpu.mig_mask & ~mask
        else:
            gpu.used_milli += sign * slot.milli
            gpu.used_memory_mib += memory


def offered_gpus(node: NodeState) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Per GPU of ``node``, its free milli and free memory MiB where it takes whole GPUs
    and shares (healthy, no MIG instance, MIG not enabled), else 0 and 0: how placement's
    numpy mirror of the nodes reads them (``policies.placement.arrays``), one compiled
    call a node instead of an interpreted read of each GPU's fields."""
    free: list[int] = []
    memory: list[int] = []
    for g in node.gpus:
        if g.healthy and not g.mig_mask and g.whole_ok:
            free.append(1000 - g.used_milli)
            memory.append(g.info.memory_mib - g.used_memory_mib)
        else:
            free.append(0)
            memory.append(0)
    return tuple(free), tuple(memory)


def _book(state: ClusterState, job: JobState, workers: tuple[WorkerAssignment, ...], sign: int) -> None:
    """``book_resources`` for each worker, inlined (it runs for every placement and every
    ended attempt), plus the node's job set and the team's usage."""
    spec = job.spec
    res = spec.resources
    cpu, mem = sign * res.cpu_milli, sign * res.memory_mib
    mig = res.mig_profile
    memory = sign * _share_memory(res)
    job_id = job.job_id
    nodes = state.nodes
    for w in workers:
        node = nodes[w.node]
        node.used_cpu += cpu
        node.used_mem += mem
        gpus = node.gpus
        if mig:
            for slot in w.gpus:
                gpu = gpus[slot.index]
                mask = slice_mask(slot.mig_profile, slot.mig_start)
                gpu.mig_mask = gpu.mig_mask | mask if sign > 0 else gpu.mig_mask & ~mask
        elif memory:   # a share with a GPU-memory request
            for slot in w.gpus:
                gpu = gpus[slot.index]
                gpu.used_milli += sign * slot.milli
                gpu.used_memory_mib += memory
        else:   # checked on placement: every slot of a non-MIG job is whole or a share
            for slot in w.gpus:
                gpus[slot.index].used_milli += sign * slot.milli
        if sign > 0:
            node.jobs.add(job_id)
        else:
            node.jobs.discard(job_id)
    usage = state.usage.get(spec.team) or state.team_usage(spec.team)
    count = sign * len(workers)   # these workers, not the whole gang
    usage.gpu_milli += count * res.milli
    usage.cpu_milli += count * res.cpu_milli
    usage.memory_mib += count * res.memory_mib
    usage.jobs += sign


def settle_ledger(state: ClusterState, team: str, usage: Usage) -> None:
    """Decay ``team``'s ledger entry to the log's clock with what it held since (``usage``,
    before the change the caller is about to make): exact, as the usage was constant.
    Called by the reducer only, never by ``commit``/``release``: schedulers book
    tentatively with those, and the ledger must not depend on whether they did."""
    entry = state.ledger.get(team)
    now = state.clock
    if entry is None:
        state.ledger[team] = TeamLedger(now, float(usage.gpu_milli), float(usage.cpu_milli), float(usage.memory_mib))
        return
    elapsed = now - entry.at
    if elapsed <= 0.0:
        return
    half_life = state.ledger_half_life_s
    keep = 0.5 ** (elapsed / half_life) if half_life > 0.0 else 0.0
    g, c, m = usage.gpu_milli, usage.cpu_milli, usage.memory_mib
    entry.gpu_milli = g + (entry.gpu_milli - g) * keep
    entry.cpu_milli = c + (entry.cpu_milli - c) * keep
    entry.memory_mib = m + (entry.memory_mib - m) * keep
    entry.at = now


def commit(state: ClusterState, job: JobState, workers: tuple[WorkerAssignment, ...]) -> None:
    _book(state, job, workers, +1)


def release(state: ClusterState, job: JobState, workers: tuple[WorkerAssignment, ...]) -> None:
    _book(state, job, workers, -1)
