"""EASY backfill: a reservation for the head-of-line job, and a hold that protects it.

When the first job of the queue cannot be placed (typically a big gang on a busy
cluster), smaller jobs behind it would otherwise take every GPU that frees up and the
gang could wait forever. ``reserve_for_head_of_line`` finds when and where it could run:
running jobs are expected to end at ``start + time_limit_s`` (``max_runtime_s``, or the
pool's default time limit; never, when there is none), so for every node we replay its jobs' ends in order until the node can host
one more worker of the head, and take the earliest slots across nodes. The latest of
those times is the *shadow time*. Other jobs may then run (be backfilled) only if they
cannot delay it: they end before the shadow time, or they fit without touching the
capacity the reservation needs (``ReservationHold``).
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Mapping

from gpusched.core.capacity import commit, release
from gpusched.core.mig import FULL_MASK, parse_profile
from gpusched.core.model import JobPhase, WorkerAssignment
from gpusched.core.state import ClusterState, GpuState, JobState, NodeState
from gpusched.policies.booking import Booking
from gpusched.policies.gpu_fit import fits_node, pick_gpus


def expected_end(job: JobState, now: float) -> float:
    """When ``job`` should have released its GPUs; ``inf`` when its runtime is unknown.
    A job booked in this cycle (still pending) starts ``now``; one being preempted is
    about to release; one past its estimate ends any moment."""
    estimate = job.time_limit_s
    if job.phase is JobPhase.PREEMPTING or job.phase is JobPhase.STOPPING:
        return now
    if estimate <= 0:
        return math.inf
    if job.phase is JobPhase.RUNNING:
        start = job.started_at
    elif job.phase is JobPhase.PLACED:
        start = job.placed_at
    else:
        start = now
    return max(now, start + estimate)


def ends_before(job: JobState, now: float, deadline: float) -> bool:
    estimate = job.time_limit_s
    return estimate > 0 and now + estimate <= deadline


@dataclass(frozen=True, slots=True)
class Reservation:
    job: JobState
    shadow_s: float                               # when every reserved slot is free
    workers: tuple[WorkerAssignment, ...]


def reserve_for_head_of_line(state: ClusterState, job: JobState, now: float,
                             booked: Mapping[str, tuple[WorkerAssignment, ...]] = {},
                             ) -> Reservation | None:
    """The earliest slots where every worker of ``job`` fits once running jobs end, or
    None when that never happens (it fits no node, or it waits on jobs of unknown
    runtime). ``booked``: placements made earlier in this cycle, not yet in the log.

    Sweeps the expected ends in time order, releasing each on a scratch copy of its node
    and offering that node another worker, until every worker has a slot: the work is
    proportional to the ends before the shadow time, not to the cluster."""
    sweep = _Sweep(job)
    candidates = [node for node in state.nodes.values() if _could_ever_host(node, job)]
    for node in candidates:
        sweep.offer(node, now)
        if sweep.done:
            return sweep.reservation(now)
    ends = [(end, i, node.name, holder, here)
            for node in candidates for i, (end, holder, here) in enumerate(_ends_on(state, node, booked, now))
            if end < math.inf]
    heapq.heapify(ends)
    while ends:
        t = ends[0][0]
        touched = set()
        while ends and ends[0][0] == t:   # everything ending at t frees at once
            _, _, name, holder, here = heapq.heappop(ends)
            sweep.release(state.nodes[name], holder, here)
            touched.add(name)
        for name in sorted(touched):
            sweep.offer(sweep.scratch.nodes[name], t)
        if sweep.done:
            return sweep.reservation(t)
    return None


class _Sweep:
    """Scratch copies of the nodes the sweep changed, and the slots found so far."""

    def __init__(self, job: JobState) -> None:
        self.job = job
        self.scratch = ClusterState()
        self.found: list[WorkerAssignment] = []

    @property
    def done(self) -> bool:
        return len(self.found) == self.job.spec.workers

    def release(self, node: NodeState, holder: JobState, here: tuple[WorkerAssignment, ...]) -> None:
        if node.name not in self.scratch.nodes:
            self.scratch.nodes[node.name] = _copy(node)
        release(self.scratch, holder, here)

    def offer(self, node: NodeState, t: float) -> None:
        """Give ``node`` as many of the remaining workers as it can host now."""
        res = self.job.spec.resources
        while not self.done and fits_node(node, res):
            slots = pick_gpus(node, res)
            if slots is None:
                return
            if node.name not in self.scratch.nodes:
                node = self.scratch.nodes[node.name] = _copy(node)
            assignment = WorkerAssignment(len(self.found), node.name, slots)
            commit(self.scratch, self.job, (assignment,))
            self.found.append(assignment)

    def reservation(self, shadow: float) -> Reservation:
        return Reservation(self.job, shadow, tuple(self.found))


def _could_ever_host(node: NodeState, job: JobState) -> bool:
    res = job.spec.resources
    return (node.schedulable and node.info.pool == job.spec.pool and res.allows(node.model)
            and node.info.cpu_milli >= res.cpu_milli and node.info.memory_mib >= res.memory_mib
            and sum(1 for g in node.gpus if g.healthy) >= max(res.gpus, 1 if res.milli else 0))


def _copy(node: NodeState) -> NodeState:
    gpus = [GpuState(g.info, g.healthy, g.used_milli, g.mig_mask, g.used_memory_mib, g.whole_ok, g.mig_slots)
            for g in node.gpus]
    return NodeState(node.info, gpus, node.status, node.used_cpu, node.used_mem, set(node.jobs))


def _ends_on(state: ClusterState, node: NodeState, booked: Mapping[str, tuple[WorkerAssignment, ...]],
             now: float):
    for job_id in node.jobs:
        holder = state.jobs[job_id]
        here = tuple(w for w in booked.get(job_id, holder.workers) if w.node == node.name)
        if here:
            yield expected_end(holder, now), holder, here


class ReservationHold:
    """Makes the capacity a reservation needs, as far as it is free now, look taken.

    While applied, a job placed in the state cannot use anything the reserved job will
    need at the shadow time, so it cannot delay it. Only free capacity is held (never
    more than a GPU, CPU or memory has), so the state stays within capacity and
    placement scorers see ordinary numbers. Lift it to place a job that ends before the
    shadow time, then apply it again: it then holds what that job left free, which is
    enough, because that job will be gone when the reservation starts.
    """

    def __init__(self, state: ClusterState, reservation: Reservation, booking: Booking) -> None:
        self.state = state
        self.reservation = reservation
        self.booking = booking           # told which nodes changed, for its placement views
        res = reservation.job.spec.resources
        self._cpu: dict[str, int] = {}
        self._mem: dict[str, int] = {}
        self._milli: dict[tuple[str, int], int] = {}
        self._gpu_mem: dict[tuple[str, int], int] = {}   # GPU memory a reserved share asks
        self._mig: dict[tuple[str, int], int] = {}
        for w in reservation.workers:
            self._cpu[w.node] = self._cpu.get(w.node, 0) + res.cpu_milli
            self._mem[w.node] = self._mem.get(w.node, 0) + res.memory_mib
            for slot in w.gpus:
                key = (w.node, slot.index)
                if slot.mig_profile:
                    self._mig[key] = self._mig.get(key, 0) | parse_profile(slot.mig_profile).mask(slot.mig_start)
                else:
                    self._milli[key] = self._milli.get(key, 0) + slot.milli
                    if res.is_share and res.gpu_memory_mib:
                        self._gpu_mem[key] = self._gpu_mem.get(key, 0) + res.gpu_memory_mib
        self._undo: list[tuple[str, object, int]] = []

    def apply(self) -> None:
        assert not self._undo, "hold applied twice"
        nodes = self.state.nodes
        for name, cpu in self._cpu.items():
            node = nodes[name]
            self._take(node, "used_cpu", max(0, min(cpu, node.free_cpu)))
            self._take(node, "used_mem", max(0, min(self._mem[name], node.free_mem)))
        for (name, index), milli in self._milli.items():
            gpu = nodes[name].gpus[index]
            if gpu.mig_mask:
                self._take_slices(gpu, FULL_MASK)
            else:
                self._take(gpu, "used_milli", max(0, min(milli, 1000 - gpu.used_milli)))
                need = self._gpu_mem.get((name, index), 0)
                self._take(gpu, "used_memory_mib", max(0, min(need, gpu.info.memory_mib - gpu.used_memory_mib)))
        for (name, index), mask in self._mig.items():
            gpu = nodes[name].gpus[index]
            if gpu.used_milli:
                self._take(gpu, "used_milli", 1000 - gpu.used_milli)
            else:
                self._take_slices(gpu, mask)
        self.booking.note(self._cpu.keys())   # every node the reservation uses

    def lift(self) -> None:
        if not self._undo:
            return
        while self._undo:
            kind, target, amount = self._undo.pop()
            if kind == "mig_mask":
                target.mig_mask &= ~amount
            else:
                setattr(target, kind, getattr(target, kind) - amount)
        self.booking.note(self._cpu.keys())   # every node the reservation uses

    def _take(self, target: object, attr: str, amount: int) -> None:
        if amount:
            setattr(target, attr, getattr(target, attr) + amount)
            self._undo.append((attr, target, amount))

    def _take_slices(self, gpu: GpuState, mask: int) -> None:
        bits = mask & ~gpu.mig_mask
        if bits:
            gpu.mig_mask |= bits
            self._undo.append(("mig_mask", gpu, bits))
