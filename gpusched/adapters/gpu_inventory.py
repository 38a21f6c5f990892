"""Where a node's GPUs come from: NVML on a real machine, or a simulated inventory.

Both produce the same ``GpuInfo`` records; a simulated node says so in its
``NodeRegistered`` event (``NodeInfo.simulated``), so nobody mistakes it for hardware.
"""
from __future__ import annotations

import re

from gpusched.core.catalog import CATALOG, is_mig_capable, model_from_nvml_name
from gpusched.core.model import GpuInfo

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


def nvml_gpus() -> tuple[GpuInfo, ...]:
    """The GPUs NVML reports. Raises InventoryError when NVML is absent (no driver)."""
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise InventoryError(f"NVML unavailable: {exc}") from exc
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = _text(pynvml.nvmlDeviceGetName(h))
            memory = pynvml.nvmlDeviceGetMemoryInfo(h).total // (1024 * 1024)
            model = model_from_nvml_name(name)
            gpus.append(GpuInfo(i, _text(pynvml.nvmlDeviceGetUUID(h)), model, int(memory), _mig_capable(pynvml, h)))
        return tuple(gpus)
    finally:
        pynvml.nvmlShutdown()


def _mig_capable(pynvml, handle) -> bool:
    try:
        pynvml.nvmlDeviceGetMigMode(handle)
        return True
    except pynvml.NVMLError:   # NOT_SUPPORTED on GPUs without MIG
        return False


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
