"""deploy/gpu_check.py's verdicts, without a GPU: what counts as the simulated backend
disagreeing with NVML, and the fault record the simulated backend delivers."""
from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import pytest

from gpusched.adapters.gpu_inventory import simulated_gpus

_spec = importlib.util.spec_from_file_location(
    "gpu_check", Path(__file__).resolve().parents[3] / "deploy" / "gpu_check.py")
gpu_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_check)


def _real(count: int, base: str = "H200-141GB", **change):
    return tuple(dataclasses.replace(g, uuid=f"GPU-real-{g.index}", **change)
                 for g in simulated_gpus(f"{count}x{base}", "real"))


@pytest.mark.parametrize("real, expected", [
    (_real(8), []),                                    # only UUIDs differ: agreement
    (_real(1, "H100-80GB"), []),
    ((), ["NVML reports no GPU"]),
    (_real(1, memory_mib=143_000), ["GPU 0 memory_mib: NVML 143000, simulated 143771"]),
    (_real(1, mig_capable=False), ["GPU 0 mig_capable: NVML False, simulated True"]),
    (_real(1) + _real(1, "H100-80GB"), ["mixed models ['H100-80GB', 'H200-141GB']: a simulated node has one"]),
    (_real(1, model="B200"), ["NVML model 'B200' is not in the catalog: a simulated node cannot be one"]),
])
def test_compare_with_simulated(real, expected):
    assert gpu_check.compare_with_simulated(real) == expected


async def test_simulated_fault_is_the_record_the_real_watch_emits_bar_the_reason():
    fault = await gpu_check.simulated_fault_shape()
    assert fault == {"gpu_index": 0, "reason": "XID 79 (simulated NVML)", "xid": 79, "fatal": True}
