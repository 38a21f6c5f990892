"""A worker's devices: MIG UUIDs in CUDA_VISIBLE_DEVICES, MPS limits for shares, and
dynamic MIG through the fake NVML (create, destroy, NVML errors)."""
from __future__ import annotations

import pytest

from gpusched.adapters.gpus.fake_nvml import FakeNvml
from gpusched.adapters.gpus.gpu_inventory import nvml_gpus
from gpusched.core.model import GpuSlot, NodeInfo, WorkerResources
from gpusched_node_agent.devices import (
    MigError, MigManager, WorkerDevices, device_env, mps_running,
)
from tests.unit.adapters.mig_specs import mig_node

SHARE = WorkerResources(gpu_milli=250, gpu_memory_mib=20_000)


def node(nvml: FakeNvml, dynamic: bool = False) -> NodeInfo:
    return NodeInfo("n1", "default", 64_000, 256_000, nvml_gpus(nvml), dynamic_mig=dynamic)


def test_mig_slot_gets_its_instance_uuid_not_the_gpu_uuid():
    info = node(FakeNvml(mig_node()))
    env = device_env(info, (GpuSlot(0, 428, "3g", 0),), WorkerResources(mig_profile="3g"), mps=False)
    assert env == {"CUDA_VISIBLE_DEVICES": "MIG-3g-a"}
    env = device_env(info, (GpuSlot(0, 142, "1g.18gb", 4),), WorkerResources(mig_profile="1g.18gb"), mps=True)
    assert env == {"CUDA_VISIBLE_DEVICES": "MIG-1g-b"}   # MPS limits are for shares only


def test_whole_gpus_by_uuid():
    info = node(FakeNvml(mig_node()))
    env = device_env(info, (GpuSlot(1),), WorkerResources(gpus=1), mps=True)
    assert env == {"CUDA_VISIBLE_DEVICES": "GPU-1"}


def test_share_gets_mps_limits_only_where_mps_runs():
    info = node(FakeNvml(mig_node()))
    assert device_env(info, (GpuSlot(1, 250),), SHARE, mps=False) == {"CUDA_VISIBLE_DEVICES": "GPU-1"}
    assert device_env(info, (GpuSlot(1, 250),), SHARE, mps=True) == {
        "CUDA_VISIBLE_DEVICES": "GPU-1", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=20000M"}
    small = WorkerResources(gpu_milli=3)   # rounds up; no memory request, no memory limit
    assert device_env(info, (GpuSlot(1, 3),), small, mps=True) == {
        "CUDA_VISIBLE_DEVICES": "GPU-1", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "1"}


def test_slot_without_an_instance_is_a_clear_error():
    info = node(FakeNvml(mig_node()))
    with pytest.raises(MigError, match="no MIG instance 1g at slice 5"):
        device_env(info, (GpuSlot(0, 142, "1g", 5),), WorkerResources(mig_profile="1g"), mps=False)


def test_mps_detection(tmp_path):
    assert not mps_running({"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path)})
    (tmp_path / "control").touch()
    assert mps_running({"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path)})


def test_dynamic_mig_creates_then_destroys():
    nvml = FakeNvml(mig_node())
    info = node(nvml, dynamic=True)
    devices = WorkerDevices(info, (GpuSlot(0, 285, "2g", 6),), WorkerResources(mig_profile="2g"), False,
                            MigManager(info, nvml))
    with pytest.raises(MigError, match="create GPU instance"):   # 2g does not start at 6
        devices.acquire()
    devices = WorkerDevices(info, (GpuSlot(0, 142, "1g", 6),), WorkerResources(mig_profile="1g"), False,
                            MigManager(info, nvml))
    env = devices.acquire()
    uuid = env["CUDA_VISIBLE_DEVICES"]
    live = {m.uuid: (m.profile, m.start) for m in nvml_gpus(nvml)[0].mig_instances}
    assert uuid.startswith("MIG-") and live[uuid] == ("1g.18gb", 6)
    devices.release()
    assert uuid not in {m.uuid for m in nvml_gpus(nvml)[0].mig_instances}
    assert len(nvml_gpus(nvml)[0].mig_instances) == 2   # the existing ones stay


def test_dynamic_mig_uses_an_existing_instance_without_creating_one():
    nvml = FakeNvml(mig_node({"nvmlDeviceCreateGpuInstanceWithPlacement": "NVML_ERROR_UNKNOWN"}))
    info = node(nvml, dynamic=True)
    devices = WorkerDevices(info, (GpuSlot(0, 428, "3g", 0),), WorkerResources(mig_profile="3g"), False,
                            MigManager(info, nvml))
    assert devices.acquire() == {"CUDA_VISIBLE_DEVICES": "MIG-3g-a"}
    devices.release()
    assert [m.uuid for m in nvml_gpus(nvml)[0].mig_instances] == ["MIG-3g-a", "MIG-1g-b"]


def test_create_errors_leave_no_half_made_instance():
    nvml = FakeNvml(mig_node({"nvmlGpuInstanceCreateComputeInstance": "NVML_ERROR_INSUFFICIENT_RESOURCES"}))
    info = node(nvml, dynamic=True)
    manager = MigManager(info, nvml)
    with pytest.raises(MigError, match="cannot create compute instance"):
        manager.create(GpuSlot(0, 142, "1g", 5))
    assert len(nvml.gpus[0].gis) == 2 and manager.created == {}
    nvml = FakeNvml(mig_node({"nvmlDeviceCreateGpuInstanceWithPlacement": "NVML_ERROR_INSUFFICIENT_RESOURCES"}))
    with pytest.raises(MigError, match="cannot create GPU instance"):
        MigManager(node(nvml, True), nvml).create(GpuSlot(0, 142, "1g", 5))


def test_create_on_a_gpu_with_mig_off_and_unknown_profiles():
    nvml = FakeNvml(mig_node())
    manager = MigManager(node(nvml, True), nvml)
    with pytest.raises(MigError, match="GPU 1 offers no MIG profile 1g"):
        manager.create(GpuSlot(1, 142, "1g", 0))
    with pytest.raises(MigError, match="unknown MIG profile"):
        manager.create(GpuSlot(0, 142, "5g", 0))


def test_destroy_errors_and_refusals():
    nvml = FakeNvml(mig_node({"nvmlGpuInstanceDestroy": {"error": "NVML_ERROR_IN_USE", "times": 1}}))
    manager = MigManager(node(nvml, True), nvml)
    with pytest.raises(MigError, match="not created here"):
        manager.destroy("MIG-3g-a")    # an operator's instance is never destroyed
    uuid = manager.create(GpuSlot(0, 142, "1g", 5))
    with pytest.raises(MigError, match="cannot destroy GPU instance"):
        manager.destroy(uuid)
    # the compute instance went, the GPU instance stayed: still ours, and a retry ends it
    assert uuid in manager.created and len(nvml.gpus[0].gis) == 3
    manager.destroy(uuid)
    assert manager.created == {} and len(nvml.gpus[0].gis) == 2


def test_double_memory_1g_profile_is_placed_on_two_slices():
    nvml = FakeNvml(mig_node())
    manager = MigManager(node(nvml, True), nvml)
    uuid = manager.create(GpuSlot(0, 142, "1g.35gb", 6))
    inst = {m.uuid: m for m in nvml_gpus(nvml)[0].mig_instances}[uuid]
    assert (inst.profile, inst.start, inst.slices) == ("1g.35gb", 6, 2)
