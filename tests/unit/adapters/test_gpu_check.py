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


class Recording:
    """An NVML module that records which functions were called."""

    def __init__(self, nvml) -> None:
        self._nvml, self.calls = nvml, []

    def __getattr__(self, name):
        value = getattr(self._nvml, name)
        if callable(value) and name.startswith("nvml"):
            self.calls.append(name)
        return value


def test_mig_report_is_truthful_and_read_only():
    from gpusched.adapters.fake_nvml import FakeNvml
    from gpusched.adapters.gpu_inventory import nvml_gpus
    from tests.unit.adapters.mig_specs import h200, mig_node

    spec = mig_node()
    spec["gpus"].append(h200("GPU-2", mig="disabled", pending="enabled"))
    spec["gpus"].append({"name": "NVIDIA L40S", "memory_mib": 46_068, "mig": "unsupported"})
    nvml = Recording(FakeNvml(spec))
    report = gpu_check.mig_report(nvml)
    assert [g["mig"] for g in report] == ["enabled", "disabled", "disabled", "not supported"]
    assert report[2]["mig_mode_current_pending"] == [0, 1]     # pending shown, not applied
    assert [(m["profile"], m["start"], m["uuid"]) for m in report[0]["instances"]] == [
        ("3g.71gb", 0, "MIG-3g-a"), ("1g.18gb", 4, "MIG-1g-b")]
    assert {p["name"]: p["memory_mib"] for p in report[0]["profiles"]}["7g.141gb"] == 143_771 // 8 * 8
    assert "profiles" not in report[1]
    changing = [c for c in nvml.calls if any(w in c for w in ("Create", "Destroy", "Set", "Reset", "Clear"))]
    assert changing == [], changing
    assert gpu_check.mig_agrees(report, nvml_gpus(FakeNvml(spec))) == []
    wrong = [dataclasses.replace(g, mig_instances=()) for g in nvml_gpus(FakeNvml(spec))]
    assert gpu_check.mig_agrees(report, wrong) == ["GPU 0 registers instances [], NVML ['MIG-3g-a', 'MIG-1g-b']"]
