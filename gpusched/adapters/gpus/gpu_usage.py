"""Reading what a node's GPUs actually do: NVML on a real node, a workload model on a
simulated one. Both map each running worker to ``GpuSample``s of its GPUs.

What NVML can and cannot say, and what the samples therefore mean:

* Whole GPU: ``nvmlDeviceGetUtilizationRates().gpu`` is the percentage of the driver's
  last sample period (1/6 s to 1 s by product) in which a kernel ran: a point reading
  that the record lets stand for its whole window. Memory used and board power per GPU.
* A share (``gpu_milli``): NVML reports the GPU, not a tenant, so every tenant's sample
  carries the whole GPU's SM utilization and memory. A consumer weighting it by the
  tenant's milli gets the GPU right in total but cannot tell a busy tenant from an idle
  one beside it.
* MIG: NVML has no SM utilization per GPU instance (-1, "not measured"); the memory used
  is the MIG device's where its handle can be found; power is the board's and is left
  unmeasured rather than charged to one instance.

The simulated model mirrors these shapes (a share reads the sum of its GPU's tenants,
MIG has no SM reading), so consumers see on a simulated node what they would see on
hardware; its records are marked ``simulated``.
"""
from __future__ import annotations

import fnmatch
import logging
import random
from dataclasses import dataclass
from pathlib import Path

from gpusched.adapters.nodes.usage_records import UNMEASURED, GpuSample
from gpusched.core.mig import parse_profile
from gpusched.core.model import GpuInfo, GpuSlot

log = logging.getLogger(__name__)
Key = tuple[str, int, int]   # (job id, attempt, worker)


@dataclass(frozen=True, slots=True)
class RunningWorker:
    """What a sampler needs to know of one worker running on this node."""

    job_id: str
    attempt: int
    worker: int
    name: str                         # the job's name (simulated rules match on it)
    kind: str                         # "training" | "inference"
    gpus: tuple[GpuSlot, ...]
    usage_file: Path | None = None    # where the workload states its own load (simulated GPUs)

    @property
    def key(self) -> Key:
        return (self.job_id, self.attempt, self.worker)


def slot_milli(slot: GpuSlot) -> int:
    if slot.mig_profile:
        profile = parse_profile(slot.mig_profile)
        return profile.milli if profile else slot.milli
    return slot.milli or 1000


# --- NVML ---------------------------------------------------------------------------
class NvmlSampler:
    """Reads NVML once per GPU per call. ``nvml`` is the pynvml module (tests pass a
    fake with the same functions); ``start`` initialises NVML, ``close`` shuts it down."""

    simulated = False

    def __init__(self, nvml, gpus: tuple[GpuInfo, ...]) -> None:
        self.nvml = nvml
        self.gpus = {g.index: g for g in gpus}
        self._handles: dict[int, object] = {}

    def start(self) -> None:
        self.nvml.nvmlInit()
        self._handles = {i: self.nvml.nvmlDeviceGetHandleByIndex(i) for i in self.gpus}

    def close(self) -> None:
        self._handles = {}
        self.nvml.nvmlShutdown()

    def read(self, workers: list[RunningWorker]) -> dict[Key, tuple[GpuSample, ...]]:
        boards: dict[int, tuple[float, int, float]] = {}   # one reading per GPU per call
        out = {}
        for w in workers:
            samples = []
            for slot in w.gpus:
                if slot.index not in self._handles:
                    continue
                if slot.mig_profile:
                    samples.append(self._mig(slot))
                    continue
                if slot.index not in boards:
                    boards[slot.index] = self._board(self._handles[slot.index])
                sm, memory, power = boards[slot.index]
                samples.append(GpuSample(slot.index, self.gpus[slot.index].uuid, slot_milli(slot),
                                         sm, memory, power))
            out[w.key] = tuple(samples)
        return out

    def _board(self, handle) -> tuple[float, int, float]:
        nvml = self.nvml
        sm = self._try(lambda: float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu), UNMEASURED)
        memory = self._try(lambda: int(nvml.nvmlDeviceGetMemoryInfo(handle).used) // 2**20, -1)
        power = self._try(lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0, UNMEASURED)   # mW
        return sm, memory, power

    def _mig(self, slot: GpuSlot) -> GpuSample:
        uuid, memory = self.gpus[slot.index].uuid, -1
        device = self._try(lambda: self._mig_device(self._handles[slot.index], slot.mig_start), None)
        if device is not None:
            uuid = self._try(lambda: _text(self.nvml.nvmlDeviceGetUUID(device)), uuid)
            memory = self._try(lambda: int(self.nvml.nvmlDeviceGetMemoryInfo(device).used) // 2**20, -1)
        return GpuSample(slot.index, uuid, slot_milli(slot), UNMEASURED, memory, UNMEASURED, slot.mig_profile)

    def _mig_device(self, parent, start: int):
        """The MIG device whose GPU instance starts at memory slice ``start``, or None."""
        nvml = self.nvml
        for i in range(nvml.nvmlDeviceGetMaxMigDeviceCount(parent)):
            try:
                device = nvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, i)
            except nvml.NVMLError:   # NOT_FOUND: no device in this slot
                continue
            instance = nvml.nvmlDeviceGetGpuInstanceById(parent, nvml.nvmlDeviceGetGpuInstanceId(device))
            if nvml.nvmlGpuInstanceGetInfo(instance).placement.start == start:
                return device
        return None

    def _try(self, read, default):
        try:
            return read()
        except self.nvml.NVMLError as exc:   # NOT_SUPPORTED in some VMs, GPU lost, ...
            log.debug("NVML reading failed: %s", exc)
            return default


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# --- the simulated model --------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class UsageRule:
    """Simulated nodes: jobs whose name matches ``pattern`` (fnmatch) load their GPUs at
    ``percent`` (no noise). The per-job knob of the model, e.g. ``notebook-*=0``."""

    pattern: str
    percent: float


def parse_usage_rule(text: str) -> UsageRule:
    pattern, sep, value = text.rpartition("=")
    try:
        percent = float(value)
    except ValueError:
        percent = -1.0
    if not sep or not pattern or not 0.0 <= percent <= 100.0:
        raise ValueError(f"{text!r} is not PATTERN=PERCENT with PERCENT in 0..100, e.g. 'notebook-*=0'")
    return UsageRule(pattern, percent)


# Board power of the simulated model: idle is a tenth of the maximum (what an H100 draws
# with nothing running, ~70 of 700 W); the rest scales with SM utilization.
MAX_POWER_W = {"H200": 700.0, "H100": 700.0, "A100": 400.0, "L40S": 350.0, "A10": 150.0, "T4": 70.0}
DEFAULT_MAX_POWER_W = 300.0
TRAINING_LOAD, INFERENCE_LOAD = 0.90, 0.45         # mean SM fraction of a worker's part
TRAINING_MEMORY, INFERENCE_MEMORY = 0.85, 0.50     # fraction of the part's memory held


class SimulatedSampler:
    """A model of the workload: training keeps its GPUs ~90 % busy, inference ~45 %, each
    with noise, scaled by the worker's part of the GPU (a 250-milli share at 45 % adds
    ~11 % to its GPU). A rule can pin a job's load (``UsageRule``), and a real process on
    simulated GPUs states its own by writing a percentage into the worker's usage file
    (``GPUSCHED_USAGE_FILE``), which wins over both. An idle job still holds its memory."""

    simulated = True

    def __init__(self, gpus: tuple[GpuInfo, ...], rules: tuple[UsageRule, ...] = (), seed: int | None = None) -> None:
        self.gpus = {g.index: g for g in gpus}
        self.rules = rules
        self._rng = random.Random(seed)

    def start(self) -> None:
        return None

    def close(self) -> None:
        return None

    def load(self, w: RunningWorker) -> float:
        """The fraction (0..1) of its part of each GPU the worker keeps busy now."""
        stated = _stated_load(w.usage_file)
        if stated is not None:
            return stated
        for rule in self.rules:
            if fnmatch.fnmatchcase(w.name, rule.pattern):
                return rule.percent / 100
        mean, spread = (INFERENCE_LOAD, 0.10) if w.kind == "inference" else (TRAINING_LOAD, 0.03)
        return min(1.0, max(0.0, self._rng.gauss(mean, spread)))

    def read(self, workers: list[RunningWorker]) -> dict[Key, tuple[GpuSample, ...]]:
        loads = {w.key: self.load(w) for w in workers}
        busy: dict[int, float] = {}     # GPU index -> SM fraction, summed over its tenants
        memory: dict[int, float] = {}
        for w in workers:
            held = INFERENCE_MEMORY if w.kind == "inference" else TRAINING_MEMORY
            for slot in w.gpus:
                if slot.index in self.gpus and not slot.mig_profile:
                    part = slot_milli(slot) / 1000
                    busy[slot.index] = busy.get(slot.index, 0.0) + loads[w.key] * part
                    memory[slot.index] = memory.get(slot.index, 0.0) + held * part
        return {w.key: tuple(self._sample(w, s, busy, memory) for s in w.gpus if s.index in self.gpus)
                for w in workers}

    def _sample(self, w: RunningWorker, slot: GpuSlot, busy: dict[int, float], memory: dict[int, float]) -> GpuSample:
        gpu = self.gpus[slot.index]
        if slot.mig_profile:   # as NVML: no SM reading per instance, the instance's memory
            profile = parse_profile(slot.mig_profile)
            share = profile.width / 8 if profile else 0.0
            held = INFERENCE_MEMORY if w.kind == "inference" else TRAINING_MEMORY
            return GpuSample(slot.index, gpu.uuid, slot_milli(slot), UNMEASURED,
                             int(gpu.memory_mib * share * held), UNMEASURED, slot.mig_profile)
        sm = min(1.0, busy[slot.index])
        top = _max_power(gpu.model)
        return GpuSample(slot.index, gpu.uuid, slot_milli(slot), round(100 * sm, 1),
                         int(gpu.memory_mib * min(1.0, memory[slot.index])), round(top * (0.1 + 0.9 * sm), 1))


def _max_power(model: str) -> float:
    return next((w for prefix, w in MAX_POWER_W.items() if model.startswith(prefix)), DEFAULT_MAX_POWER_W)


def _stated_load(path: Path | None) -> float | None:
    """The percentage a workload wrote into its usage file, as a fraction; None when
    there is no file or no number in it (the model's own guess applies then)."""
    if path is None:
        return None
    try:
        value = float(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return min(1.0, max(0.0, value / 100)) if value == value else None   # NaN: no statement
