"""The GPU models gpusched knows, and how vendor names map onto them.

Admission rejects a spec naming a model that is neither here nor registered by a node of
the pool, so a typo ("H10O") fails at submit time instead of pending forever.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GpuModel:
    name: str
    memory_mib: int
    mig_capable: bool = False


_MODELS = (
    GpuModel("H200-141GB", 143_771, mig_capable=True),
    GpuModel("H100-80GB", 81_559, mig_capable=True),
    GpuModel("A100-80GB", 81_920, mig_capable=True),
    GpuModel("A100-40GB", 40_960, mig_capable=True),
    GpuModel("L40S-48GB", 46_068),
    GpuModel("A10-24GB", 23_028),
    GpuModel("T4-16GB", 15_360),
    GpuModel("V100M32", 32_768),
    GpuModel("V100M16", 16_384),
    GpuModel("P100", 16_384),
    GpuModel("T4", 15_360),
    GpuModel("A10", 23_028),
    # Undisclosed models of the Alibaba openb trace.
    GpuModel("G1", 16_384),
    GpuModel("G2", 32_768),
    GpuModel("G3", 32_768),
)
CATALOG: dict[str, GpuModel] = {m.name: m for m in _MODELS}

# NVML reports marketing names ("NVIDIA H100 80GB HBM3"); map them by keyword.
_NVML_KEYWORDS = (
    ("H200", "H200-141GB"),
    ("H100", "H100-80GB"),
    ("A100-SXM4-40GB", "A100-40GB"),
    ("A100-PCIE-40GB", "A100-40GB"),
    ("A100", "A100-80GB"),
    ("L40S", "L40S-48GB"),
    ("A10", "A10-24GB"),
    ("T4", "T4-16GB"),
)


def model_from_nvml_name(name: str) -> str:
    """Catalog name for an NVML product name; unknown products keep a cleaned name."""
    upper = name.upper()
    for keyword, model in _NVML_KEYWORDS:
        if keyword in upper:
            return model
    return name.replace("NVIDIA ", "").strip().replace(" ", "-")


def is_mig_capable(model: str) -> bool:
    known = CATALOG.get(model)
    return bool(known and known.mig_capable)
