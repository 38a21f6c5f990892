"""The NVML inventory (``nvml_gpus``) against the fake NVML: MIG mode as NVML reports it,
existing instances with their MIG UUIDs, and profile memory from NVML's profile info."""
from __future__ import annotations

import pytest

from gpusched.adapters.gpus.fake_nvml import FakeNvml
from gpusched.adapters.gpus.gpu_inventory import InventoryError, nvml_gpus, profile_name
from gpusched.core.model import MigMode

from .mig_specs import h200, mig_node, write


def test_mig_enabled_gpu_registers_its_instances_and_profiles():
    gpu, off = nvml_gpus(FakeNvml(mig_node()))
    assert gpu.mig_capable and gpu.mig_mode is MigMode.ENABLED
    assert [(m.profile, m.start, m.uuid, m.slices) for m in gpu.mig_instances] == [
        ("3g.71gb", 0, "MIG-3g-a", 4), ("1g.18gb", 4, "MIG-1g-b", 1)]
    names = {p.name: p for p in gpu.mig_profiles}
    assert set(names) == {"1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"}
    # memory comes from NVML's profile info (the fake: an eighth of the GPU per slice)
    assert names["3g.71gb"].memory_mib == 143_771 // 8 * 4 and names["3g.71gb"].compute == 3
    assert gpu.mig_instances[0].memory_mib == names["3g.71gb"].memory_mib
    assert (names["1g.18gb"].instances, names["7g.141gb"].instances) == (7, 1)
    assert off.mig_capable and off.mig_mode is MigMode.DISABLED and not off.mig_instances


def test_pending_mode_does_not_count_until_a_reset():
    gpu, = nvml_gpus(FakeNvml({"gpus": [h200("GPU-0", mig="disabled", pending="enabled")]}))
    assert gpu.mig_mode is MigMode.DISABLED


def test_gpu_without_mig_is_not_capable():
    gpu, = nvml_gpus(FakeNvml({"gpus": [{"name": "NVIDIA L40S", "memory_mib": 46_068, "mig": "unsupported"}]}))
    assert (gpu.model, gpu.mig_capable, gpu.mig_mode) == ("L40S-48GB", False, MigMode.DISABLED)


def test_80gb_profiles_are_named_by_nvml():
    spec = {"gpus": [{"name": "NVIDIA H100 80GB HBM3", "memory_mib": 81_559, "mig": "enabled"}]}
    gpu, = nvml_gpus(FakeNvml(spec))
    assert [p.name for p in gpu.mig_profiles] == ["1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb", "1g.20gb"]


def test_nvml_errors():
    with pytest.raises(InventoryError, match="NVML unavailable"):
        nvml_gpus(FakeNvml({"gpus": [], "errors": {"nvmlInit": "NVML_ERROR_DRIVER_NOT_LOADED"}}))
    # a failing MIG device lookup reads as "no device there", not a crash
    gpu, _ = nvml_gpus(FakeNvml(mig_node({"nvmlDeviceGetMigDeviceHandleByIndex": "NVML_ERROR_NOT_FOUND"})))
    assert gpu.mig_mode is MigMode.ENABLED and gpu.mig_instances == ()


def test_unreadable_instances_are_a_clear_inventory_error():
    with pytest.raises(InventoryError, match="needs root to read MIG placements"):
        nvml_gpus(FakeNvml(mig_node({"nvmlDeviceGetGpuInstanceById": "NVML_ERROR_NO_PERMISSION"})))


def test_drivers_without_profile_info_v2_get_names_made_from_memory():
    spec = mig_node({"nvmlDeviceGetGpuInstanceProfileInfo_v2": "NVML_ERROR_FUNCTION_NOT_FOUND"})
    gpu, _ = nvml_gpus(FakeNvml(spec))
    names = [p.name for p in gpu.mig_profiles]
    assert names == ["1g.18gb", "2g.35gb", "3g.70gb", "4g.70gb", "7g.140gb", "1g.35gb"]
    assert [m.profile for m in gpu.mig_instances] == ["3g.70gb", "1g.18gb"]


def test_profile_names():
    assert profile_name("MIG 1g.10gb", 1, 9_856) == "1g.10gb"
    assert profile_name("", 3, 40_192) == "3g.39gb"


def test_bad_spec_names_the_problem(tmp_path):
    with pytest.raises(ValueError, match="gpus"):
        FakeNvml.from_file(write(tmp_path, {"gpu": []}))
    with pytest.raises(ValueError, match=r"gpus\[0\].instances\[0\]"):
        FakeNvml({"gpus": [h200("GPU-0", instances=[{"profile": "3g.71gb", "start": 2}])]})
    with pytest.raises(ValueError, match=r"gpus\[0\].mig"):
        FakeNvml({"gpus": [h200("GPU-0", mig="on")]})
