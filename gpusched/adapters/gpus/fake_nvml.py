"""A fake NVML: the subset of the ``pynvml`` API gpusched calls, driven by a JSON spec.

A test harness, not a simulator of GPUs: it lets the inventory (``gpu_inventory``), the
health watch (``gpu_health``) and the node-agent's MIG manager run their real NVML code
paths — MIG modes, existing GPU and compute instances, MIG device UUIDs, profile info,
instance creation and destruction, NVML errors — on a machine without a GPU. Functions
take and return what ``pynvml``'s do (handles are opaque objects here), errors are
``pynvml.NVMLError`` with NVML's own codes, and constants are ``pynvml``'s.

Spec (``FakeNvml.from_file``)::

    {"gpus": [{"name": "NVIDIA H200", "uuid": "GPU-0", "memory_mib": 143771,
               "mig": "enabled",          # enabled | disabled | unsupported
               "pending": "enabled",      # the mode after the next reset (default: mig)
               "instances": [{"profile": "1g.18gb", "start": 0, "uuid": "MIG-a"}]}],
     "errors": {"nvmlDeviceCreateGpuInstanceWithPlacement": "NVML_ERROR_INSUFFICIENT_RESOURCES",
                "nvmlGpuInstanceDestroy": {"error": "NVML_ERROR_IN_USE", "times": 1}},
     "journal": "/path/log"}               # optional: one line per create/destroy

Errors are injected by function name (every call, or the first ``times`` calls); profile
info is keyed by its struct version (``nvmlDeviceGetGpuInstanceProfileInfo_v2``), so a
driver without version 2 can be played.

Enumerating instances goes through MIG device handles (``nvmlDeviceGetMigDeviceHandleByIndex``)
and ``nvmlDeviceGetGpuInstanceById``, as gpusched's code does, so the ctypes-array calls
(``nvmlDeviceGetGpuInstances``) are not part of the fake.
"""
from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml

NVMLError = pynvml.NVMLError
NVMLError_Timeout = pynvml.NVMLError_Timeout
_MIB = 1024 * 1024


def _fail(code: int):
    raise pynvml.NVMLError(code)


# (NVML profile enum index, profile id, compute slices, memory slices, starts, suffix per
# GPU class): NVIDIA's MIG profiles for the 8-memory-slice GPUs (A100, H100, H200).
_SHAPES = (
    (pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE, 19, 1, 1, (0, 1, 2, 3, 4, 5, 6)),
    (pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2, 15, 1, 2, (0, 2, 4, 6)),
    (pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE, 14, 2, 2, (0, 2, 4)),
    (pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE, 9, 3, 4, (0, 4)),
    (pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE, 5, 4, 4, (0,)),
    (pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE, 0, 7, 8, (0,)),
)
# GB in the profile names, by memory slices (1, 2, 4, 8), per GPU class.
_GB = {"H200": (18, 35, 71, 141), "80GB": (10, 20, 40, 80), "40GB": (5, 10, 20, 40)}


@dataclass(frozen=True)
class Profile:
    index: int
    id: int
    compute: int
    slices: int
    starts: tuple[int, ...]
    name: str
    memory_mib: int


def profiles_for(name: str, memory_mib: int) -> tuple[Profile, ...]:
    key = "H200" if "H200" in name else "40GB" if memory_mib < 60_000 else "80GB"
    gb = dict(zip((1, 2, 4, 8), _GB[key]))
    slice_mib = memory_mib // 8
    return tuple(Profile(i, pid, c, s, starts, f"{c}g.{gb[s]}gb", slice_mib * s) for i, pid, c, s, starts in _SHAPES)


@dataclass(eq=False)
class ComputeInstance:
    gi: GpuInstance
    id: int
    profile_id: int
    uuid: str


@dataclass(eq=False)
class GpuInstance:
    gpu: Gpu
    id: int
    profile: Profile
    start: int
    cis: list[ComputeInstance] = field(default_factory=list)


@dataclass(eq=False)
class Gpu:
    index: int
    name: str
    uuid: str
    memory_mib: int
    mig: str               # enabled | disabled | unsupported
    pending: str
    profiles: tuple[Profile, ...]
    gis: list[GpuInstance] = field(default_factory=list)
    next_gi: int = 1

    def profile_by_id(self, pid: int) -> Profile:
        for p in self.profiles:
            if p.id == pid:
                return p
        _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def used_mask(self) -> int:
        return sum(((1 << gi.profile.slices) - 1) << gi.start for gi in self.gis)


@dataclass(eq=False)
class MigDevice:
    ci: ComputeInstance


_MODES = {"enabled": pynvml.NVML_DEVICE_MIG_ENABLE, "disabled": pynvml.NVML_DEVICE_MIG_DISABLE}


class FakeNvml:
    """The module-like object: pass it where gpusched takes an ``nvml`` module."""

    # pynvml's constants, so code reading them from the module it was given works alike
    def __getattr__(self, name: str) -> Any:
        if name.startswith(("NVML_", "nvmlEventType", "c_nvml")):
            return getattr(pynvml, name)
        raise AttributeError(name)

    NVMLError = pynvml.NVMLError
    NVMLError_Timeout = pynvml.NVMLError_Timeout

    def __init__(self, spec: dict) -> None:
        self.spec = spec
        self.gpus: list[Gpu] = []
        self._lock = threading.Lock()   # the health watch calls from its own thread
        self._inits = 0
        self._errors: dict[str, dict] = {}
        self._uuids = 0
        for name, err in (spec.get("errors") or {}).items():
            self._errors[name] = err if isinstance(err, dict) else {"error": err}
        self.journal = Path(spec["journal"]) if spec.get("journal") else None
        for i, g in enumerate(spec.get("gpus", [])):
            self.gpus.append(self._gpu(i, g))

    @classmethod
    def from_file(cls, path: str | Path) -> FakeNvml:
        try:
            spec = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"fake NVML spec {path}: {exc}") from exc
        if not isinstance(spec, dict) or not isinstance(spec.get("gpus"), list):
            raise ValueError(f"fake NVML spec {path}: expects an object with a list 'gpus'")
        return cls(spec)

    def _gpu(self, i: int, g: dict) -> Gpu:
        name = g.get("name", "NVIDIA H100 80GB HBM3")
        memory = int(g.get("memory_mib", 81_559))
        mig = g.get("mig", "disabled")
        if mig not in ("enabled", "disabled", "unsupported"):
            raise ValueError(f"fake NVML spec: gpus[{i}].mig must be enabled, disabled or unsupported, got {mig!r}")
        gpu = Gpu(i, name, g.get("uuid", f"GPU-fake-{i}"), memory, mig, g.get("pending", mig), profiles_for(name, memory))
        for j, inst in enumerate(g.get("instances", [])):
            profile = next((p for p in gpu.profiles if p.name == inst.get("profile")), None)
            if mig != "enabled" or profile is None or inst.get("start") not in profile.starts:
                raise ValueError(f"fake NVML spec: gpus[{i}].instances[{j}] is not a valid instance of a MIG-enabled GPU")
            gi = self._add_gi(gpu, profile, inst["start"])
            gi.cis.append(ComputeInstance(gi, 0, profile.index, inst.get("uuid") or self._uuid()))
        return gpu

    # --- plumbing -----------------------------------------------------------------------
    def _uuid(self) -> str:
        self._uuids += 1
        return f"MIG-fake-{self._uuids:04d}"

    def _check(self, fn: str) -> None:
        """Raise an error the spec injects into ``fn``."""
        err = self._errors.get(fn)
        if err is None:
            return
        if "times" in err:
            if err["times"] <= 0:
                return
            err["times"] -= 1
        _fail(getattr(pynvml, err["error"]))

    def _inited(self) -> None:
        if self._inits <= 0:
            _fail(pynvml.NVML_ERROR_UNINITIALIZED)

    def _log(self, line: str) -> None:
        if self.journal is not None:
            with open(self.journal, "a") as f:
                f.write(line + "\n")

    def _add_gi(self, gpu: Gpu, profile: Profile, start: int) -> GpuInstance:
        if gpu.used_mask() & (((1 << profile.slices) - 1) << start):
            _fail(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        gi = GpuInstance(gpu, gpu.next_gi, profile, start)
        gpu.next_gi += 1
        gpu.gis.append(gi)
        return gi

    def _mig_devices(self, gpu: Gpu) -> list[MigDevice]:
        return [MigDevice(ci) for gi in sorted(gpu.gis, key=lambda g: g.id) for ci in gi.cis]

    @staticmethod
    def _enabled(gpu: Gpu) -> None:
        if gpu.mig != "enabled":
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)

    # --- init, devices ---------------------------------------------------------------
    def nvmlInit(self) -> None:
        self._check("nvmlInit")
        self._inits += 1

    def nvmlShutdown(self) -> None:
        self._inited()
        self._inits -= 1

    def nvmlDeviceGetCount(self) -> int:
        self._inited()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Gpu:
        self._inited()
        if not 0 <= index < len(self.gpus):
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self.gpus[index]

    def nvmlDeviceGetName(self, handle) -> str:
        gpu = handle.ci.gi.gpu if isinstance(handle, MigDevice) else handle
        return gpu.name

    def nvmlDeviceGetUUID(self, handle) -> str:
        return handle.ci.uuid if isinstance(handle, MigDevice) else handle.uuid

    def nvmlDeviceGetMemoryInfo(self, handle):
        mib = handle.ci.gi.profile.memory_mib if isinstance(handle, MigDevice) else handle.memory_mib
        return SimpleNamespace(total=mib * _MIB, free=mib * _MIB, used=0)

    # --- MIG mode and devices ----------------------------------------------------------
    def nvmlDeviceGetMigMode(self, handle: Gpu) -> list[int]:
        self._check("nvmlDeviceGetMigMode")
        if handle.mig == "unsupported":
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [_MODES[handle.mig], _MODES[handle.pending]]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Gpu) -> int:
        if handle.mig == "unsupported":
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Gpu, index: int) -> MigDevice:
        self._check("nvmlDeviceGetMigDeviceHandleByIndex")
        self._enabled(handle)
        devices = self._mig_devices(handle)
        if not 0 <= index < len(devices):
            _fail(pynvml.NVML_ERROR_NOT_FOUND)
        return devices[index]

    def nvmlDeviceIsMigDeviceHandle(self, handle) -> int:
        return int(isinstance(handle, MigDevice))

    def nvmlDeviceGetGpuInstanceId(self, handle: MigDevice) -> int:
        return handle.ci.gi.id

    def nvmlDeviceGetComputeInstanceId(self, handle: MigDevice) -> int:
        return handle.ci.id

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle: MigDevice) -> Gpu:
        return handle.ci.gi.gpu

    # --- GPU instances -----------------------------------------------------------------
    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle: Gpu, profile: int, version: int = 2):
        self._check(f"nvmlDeviceGetGpuInstanceProfileInfo_v{version}")
        self._enabled(handle)
        p = next((p for p in handle.profiles if p.index == profile), None)
        if p is None:
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED if 0 <= profile < pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT
                  else pynvml.NVML_ERROR_INVALID_ARGUMENT)
        info = SimpleNamespace(id=p.id, isP2pSupported=0, sliceCount=p.compute, instanceCount=len(p.starts),
                               multiprocessorCount=p.compute * 16, memorySizeMB=p.memory_mib)
        if version == 2:   # version 1 of the struct has no name
            info.name = f"MIG {p.name}".encode()
        return info

    def nvmlDeviceGetGpuInstanceById(self, handle: Gpu, gi_id: int) -> GpuInstance:
        self._check("nvmlDeviceGetGpuInstanceById")
        self._enabled(handle)
        for gi in handle.gis:
            if gi.id == gi_id:
                return gi
        _fail(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlGpuInstanceGetInfo(self, gi: GpuInstance):
        return SimpleNamespace(device=gi.gpu, id=gi.id, profileId=gi.profile.id,
                               placement=SimpleNamespace(start=gi.start, size=gi.profile.slices))

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, handle: Gpu, profile_id: int, placement) -> GpuInstance:
        with self._lock:
            self._check("nvmlDeviceCreateGpuInstanceWithPlacement")
            placement = getattr(placement, "_obj", placement)   # ctypes.byref(struct), as pynvml takes it
            self._enabled(handle)
            profile = handle.profile_by_id(profile_id)
            if placement.start not in profile.starts or placement.size != profile.slices:
                _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            gi = self._add_gi(handle, profile, placement.start)
            self._log(f"create-gi {handle.uuid} {profile.name} {placement.start} gi={gi.id}")
            return gi

    def nvmlDeviceCreateGpuInstance(self, handle: Gpu, profile_id: int) -> GpuInstance:
        self._enabled(handle)
        profile = handle.profile_by_id(profile_id)
        for start in profile.starts:
            if not handle.used_mask() & (((1 << profile.slices) - 1) << start):
                return self.nvmlDeviceCreateGpuInstanceWithPlacement(
                    handle, profile_id, SimpleNamespace(start=start, size=profile.slices))
        _fail(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)

    def nvmlGpuInstanceDestroy(self, gi: GpuInstance) -> int:
        with self._lock:
            self._check("nvmlGpuInstanceDestroy")
            if gi not in gi.gpu.gis:
                _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            if gi.cis:
                _fail(pynvml.NVML_ERROR_IN_USE)
            gi.gpu.gis.remove(gi)
            self._log(f"destroy-gi {gi.gpu.uuid} {gi.profile.name} {gi.start} gi={gi.id}")
            return pynvml.NVML_SUCCESS

    # --- compute instances -------------------------------------------------------------
    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, gi: GpuInstance, profile: int, eng_profile: int,
                                                     version: int = 2):
        # only the compute profile spanning the whole GPU instance (what gpusched creates)
        if profile != _CI_PROFILE.get(gi.profile.compute):
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(id=profile, sliceCount=gi.profile.compute, instanceCount=1,
                               multiprocessorCount=gi.profile.compute * 16)

    def nvmlGpuInstanceCreateComputeInstance(self, gi: GpuInstance, profile_id: int) -> ComputeInstance:
        with self._lock:
            self._check("nvmlGpuInstanceCreateComputeInstance")
            if profile_id != _CI_PROFILE.get(gi.profile.compute):
                _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            if gi.cis:
                _fail(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
            ci = ComputeInstance(gi, 0, profile_id, self._uuid())
            gi.cis.append(ci)
            self._log(f"create-ci {gi.gpu.uuid} gi={gi.id} ci={ci.id} {ci.uuid}")
            return ci

    def nvmlGpuInstanceGetComputeInstanceById(self, gi: GpuInstance, ci_id: int) -> ComputeInstance:
        for ci in gi.cis:
            if ci.id == ci_id:
                return ci
        _fail(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlComputeInstanceGetInfo(self, ci: ComputeInstance):
        return SimpleNamespace(device=ci.gi.gpu, gpuInstance=ci.gi, id=ci.id, profileId=ci.profile_id,
                               placement=SimpleNamespace(start=0, size=ci.gi.profile.compute))

    def nvmlComputeInstanceDestroy(self, ci: ComputeInstance) -> int:
        with self._lock:
            self._check("nvmlComputeInstanceDestroy")
            if ci not in ci.gi.cis:
                _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            ci.gi.cis.remove(ci)
            self._log(f"destroy-ci {ci.gi.gpu.uuid} gi={ci.gi.id} ci={ci.id} {ci.uuid}")
            return pynvml.NVML_SUCCESS

    # --- health (what NvmlWatch calls): no faults, ever ------------------------------
    def nvmlEventSetCreate(self):
        return SimpleNamespace()

    def nvmlDeviceRegisterEvents(self, handle, types: int, event_set) -> None:
        return None

    def nvmlEventSetWait_v2(self, event_set, timeout_ms: int):
        time.sleep(timeout_ms / 1000)   # NVML blocks this long when nothing happens
        raise pynvml.NVMLError_Timeout(pynvml.NVML_ERROR_TIMEOUT)

    def nvmlEventSetFree(self, event_set) -> None:
        return None

    def nvmlDeviceGetTotalEccErrors(self, handle, error_type: int, counter_type: int) -> int:
        return 0


# Compute instance profile covering a whole GPU instance of ``compute`` slices.
_CI_PROFILE = {1: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE, 2: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
               3: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE, 4: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE,
               7: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE}
