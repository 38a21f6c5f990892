"""Where a node's GPUs come from: NVML on a real machine, or a simulated inventory.

Both produce the same ``GpuInfo`` records; a simulated node says so in its
``NodeRegistered`` event (``NodeInfo.simulated``), so nobody mistakes it for hardware.
"""
from __future__ import annotations

import dataclasses
import re

from gpusched.core.catalog import CATALOG, is_mig_capable, model_from_nvml_name
from gpusched.core.model import GpuInfo, MigInstance, MigMode, MigProfileInfo

_SIMULATE = re.compile(r"^(\d+)x([A-Za-z0-9._-]+)$")


class InventoryError(RuntimeError):
    pass


def simulated_gpus(spec: str, node: str) -> tuple[GpuInfo, ...]:
    """'8xH100-80GB' -> eight simulated H100s with stable fake UUIDs."""
    m = _SIMULATE.match(spec.strip())
    if not m:
        raise InventoryError(f"--simulate expects COUNTxMODEL such as 8xH100-80GB, got {spec!r}")
    count, model = int(m.group(1)), m.group(2)
    if model not in CATALOG:
        raise InventoryError(f"unknown GPU model {model!r}; known: {', '.join(sorted(CATALOG))}")
    if not 1 <= count <= 16:
        raise InventoryError("a node has 1..16 GPUs")
    memory = CATALOG[model].memory_mib
    return tuple(GpuInfo(i, f"SIM-{node}-{i}", model, memory, is_mig_capable(model)) for i in range(count))


def nvml_gpus(nvml=None) -> tuple[GpuInfo, ...]:
    """The GPUs NVML reports, with their MIG mode, instances and profiles. ``nvml`` is the
    module to call (``pynvml``, or a ``FakeNvml`` in tests). Raises InventoryError when
    NVML is absent (no driver)."""
    if nvml is None:
        import pynvml as nvml

    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        raise InventoryError(f"NVML unavailable: {exc}") from exc
    try:
        return tuple(_gpu(nvml, i, nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(nvml.nvmlDeviceGetCount()))
    finally:
        nvml.nvmlShutdown()


def _gpu(nvml, index: int, h) -> GpuInfo:
    name = _text(nvml.nvmlDeviceGetName(h))
    memory = int(nvml.nvmlDeviceGetMemoryInfo(h).total // (1024 * 1024))
    info = GpuInfo(index, _text(nvml.nvmlDeviceGetUUID(h)), model_from_nvml_name(name), memory)
    mode = mig_mode(nvml, h)
    if mode is None:
        return dataclasses.replace(info, mig_mode=MigMode.DISABLED)
    if mode is MigMode.DISABLED:
        return dataclasses.replace(info, mig_capable=True, mig_mode=mode)
    profiles = mig_profiles(nvml, h)
    return dataclasses.replace(info, mig_capable=True, mig_mode=mode, mig_profiles=profiles,
                               mig_instances=mig_instances(nvml, h, profiles))


def mig_mode(nvml, handle) -> MigMode | None:
    """The GPU's current MIG mode (a pending change counts only after a GPU reset), or
    None for a GPU without MIG."""
    try:
        current, _pending = nvml.nvmlDeviceGetMigMode(handle)
    except nvml.NVMLError:   # NOT_SUPPORTED on GPUs without MIG
        return None
    return MigMode.ENABLED if current == nvml.NVML_DEVICE_MIG_ENABLE else MigMode.DISABLED


def mig_profiles(nvml, handle) -> tuple[MigProfileInfo, ...]:
    """The GPU instance profiles NVML offers on this GPU, with their memory."""
    out = []
    for index in range(nvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
        try:
            p = _profile_info(nvml, handle, index)
        except nvml.NVMLError:   # NOT_SUPPORTED / INVALID_ARGUMENT: not on this GPU
            continue
        name = profile_name(_text(getattr(p, "name", b"")), int(p.sliceCount), int(p.memorySizeMB))
        out.append(MigProfileInfo(name, int(p.id), int(p.sliceCount), int(p.memorySizeMB), int(p.instanceCount)))
    return tuple(out)


def _profile_info(nvml, handle, index: int):
    """NVML's profile info: version 2 (with the profile's name), or version 1 on drivers
    without it (the name is then made from compute slices and memory)."""
    try:
        return nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, index)
    except nvml.NVMLError as exc:
        if getattr(exc, "value", None) != nvml.NVML_ERROR_FUNCTION_NOT_FOUND:
            raise
        return nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, index, 1)


def profile_name(nvml_name: str, compute: int, memory_mib: int) -> str:
    """'MIG 1g.10gb' -> '1g.10gb'; drivers without profile names get '<c>g.<GB>gb'."""
    name = nvml_name.strip()
    if name.upper().startswith("MIG "):
        name = name[4:].strip()
    return name or f"{compute}g.{round(memory_mib / 1024)}gb"


def mig_instances(nvml, handle, profiles: tuple[MigProfileInfo, ...]) -> tuple[MigInstance, ...]:
    """The GPU's MIG devices (GPU instance + compute instance), from its MIG device handles."""
    by_id = {p.profile_id: p for p in profiles}
    out = []
    for i in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, i)
        except nvml.NVMLError:   # NOT_FOUND: no MIG device at this index
            continue
        gi_id = int(nvml.nvmlDeviceGetGpuInstanceId(mig))
        try:
            gi = nvml.nvmlGpuInstanceGetInfo(nvml.nvmlDeviceGetGpuInstanceById(handle, gi_id))
        except nvml.NVMLError as exc:   # NO_PERMISSION: GPU instance queries need root
            raise InventoryError(f"cannot read MIG GPU instance {gi_id}: {exc} (the agent needs root "
                                 "to read MIG placements)") from exc
        profile = by_id.get(int(gi.profileId))
        memory = int(nvml.nvmlDeviceGetMemoryInfo(mig).total // (1024 * 1024))
        out.append(MigInstance(
            profile=profile.name if profile else f"profile-{gi.profileId}", start=int(gi.placement.start),
            uuid=_text(nvml.nvmlDeviceGetUUID(mig)), memory_mib=profile.memory_mib if profile else memory,
            slices=int(gi.placement.size), profile_id=int(gi.profileId), gi_id=gi_id,
            ci_id=int(nvml.nvmlDeviceGetComputeInstanceId(mig))))
    return tuple(sorted(out, key=lambda m: m.start))


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
