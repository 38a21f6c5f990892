"""deploy/gpu_check.py's verdicts, without a GPU: what counts as the simulated backend
disagreeing with NVML, and the fault record the simulated backend delivers."""
from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import pytest

from gpusched.adapters.gpus.gpu_inventory import simulated_gpus

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


# The --workload check's protocol, played by a CPU stand-in for the CUDA workload.
CPU_WORKLOAD = r"""
import json, os, signal, sys, time
stop = False
def on_term(*_):
    global stop
    stop = True
signal.signal(signal.SIGTERM, on_term)
resume = os.environ.get("GPUSCHED_RESUME_FROM", "")
done = float(resume.rsplit("@", 1)[1]) if "@" in resume else 0.0
total = float(sys.argv[1])
with open("gpu.json", "w") as f:
    json.dump({"visible": 1, "uuid": os.environ["CUDA_VISIBLE_DEVICES"], "resumed_from": done}, f)
def checkpoint(progress):
    with open(os.environ["GPUSCHED_CHECKPOINT_FILE"], "w") as f:
        f.write(f"ckpt://{os.getpid()}@{progress:.3f} {progress:.3f}")
t0, last = time.monotonic(), 0.0
while not stop:
    progress = done + time.monotonic() - t0
    if progress >= total:
        checkpoint(total)
        sys.exit(0)
    time.sleep(0.01)
    if progress - last >= 0.2:
        checkpoint(progress)
        last = progress
checkpoint(done + time.monotonic() - t0)
sys.exit(143)
"""


async def test_the_workload_check_runs_the_agents_process_run_loaded_by_path(monkeypatch):
    """runner.py and its shim, loaded without the package as the device check does."""
    monkeypatch.setattr(gpu_check, "WORKLOAD", CPU_WORKLOAD)
    report = await gpu_check.workload(tuple(dataclasses.replace(g, uuid="GPU-cpu-stand-in") for g in _real(1)),
                                      total_s=1.5, grace_s=2.0)
    assert report["attempt0_exit"] == report["expected_exit"] == 143 and report["attempt1_exit"] == 0
    assert report["final_progress"] == 1.5 and report["workload_saw"][1]["resumed_from"] > 0
    assert report["cuda_visible_devices"] == "GPU-cpu-stand-in"


def test_usage_samples_read_every_gpu_each_round_and_probe_mig_devices():
    from tests.unit.adapters.fake_nvml import FakeNvml

    class Nvml(FakeNvml):
        def nvmlDeviceGetMigMode(self, h):
            return (1, 1) if h[1] == 1 else (0, 0)

    nvml = Nvml({0: {"sm": 12, "used_mib": 500, "power_mw": 90_000}, 1: {"used_mib": 20}},
                {1: [{"start": 0, "uuid": "MIG-0", "used_mib": 10}]})
    gpus = _real(2)
    usage = gpu_check.usage_samples(gpus, 2, 0.0, nvml=nvml)
    assert len(usage["rounds"]) == 2
    assert [g["sm_percent"] for g in usage["rounds"][0]["gpus"]] == [12.0, -1.0]
    assert usage["mig_enabled"] == [1]
    assert usage["mig_devices"] == [{"gpu": 1, "mig_device": 0, "uuid": "MIG-0",
                                     "utilization": "error: Not Supported", "memory_used_mib": 10}]
    assert gpu_check.usage_ok(usage, 2)
    assert nvml.initialised == 0   # shut down again


def test_usage_is_not_ok_when_a_gpu_outside_mig_mode_gives_no_sm_reading():
    gpus = [{"index": 0, "sm_percent": -1.0, "memory_used_mib": 5}]
    assert not gpu_check.usage_ok({"rounds": [{"gpus": gpus}], "mig_enabled": []}, 1)
    assert gpu_check.usage_ok({"rounds": [{"gpus": gpus}], "mig_enabled": [0]}, 1)
    assert not gpu_check.usage_ok({"rounds": [], "mig_enabled": []}, 1)


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
    from gpusched.adapters.gpus.fake_nvml import FakeNvml
    from gpusched.adapters.gpus.gpu_inventory import nvml_gpus
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
