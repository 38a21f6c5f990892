"""ProcessRun with a worker's devices, on real processes: the env reaches the process,
devices are released once it ended (before ``wait`` returns), and devices that cannot be
set up mean the process never starts."""
from __future__ import annotations

import json
import sys

import pytest

from gpusched.adapters.gpus.fake_nvml import FakeNvml
from gpusched.adapters.gpus.gpu_inventory import nvml_gpus
from gpusched.core.model import GpuSlot, NodeInfo, WorkerResources
from gpusched_node_agent.devices import MigError, MigManager, WorkerDevices
from gpusched_node_agent.runner import ProcessRun
from tests.unit.adapters.mig_specs import mig_node


def dump_env(path) -> tuple[str, ...]:
    return (sys.executable, "-c", f"import json, os; json.dump(dict(os.environ), open({str(path)!r}, 'w'))")


def dynamic_node(errors=None):
    nvml = FakeNvml(mig_node(errors))
    return nvml, NodeInfo("n1", "default", 64_000, 256_000, nvml_gpus(nvml), dynamic_mig=True)


async def test_process_sees_its_mig_device_which_is_gone_when_wait_returns(tmp_path):
    nvml, info = dynamic_node()
    devices = WorkerDevices(info, (GpuSlot(0, 142, "1g", 5),), WorkerResources(mig_profile="1g"), False,
                            MigManager(info, nvml))
    run = ProcessRun(dump_env(tmp_path / "env.json"), {"GPUSCHED_JOB_ID": "j"}, tmp_path / "w", devices=devices)
    await run.start()
    assert len(nvml.gpus[0].gis) == 3            # made before the process started
    assert (await run.wait()).exit_code == 0
    env = json.loads((tmp_path / "env.json").read_text())
    assert env["CUDA_VISIBLE_DEVICES"].startswith("MIG-fake-") and env["GPUSCHED_JOB_ID"] == "j"
    assert len(nvml.gpus[0].gis) == 2            # and gone once it ended


async def test_devices_that_cannot_be_made_stop_the_start(tmp_path):
    nvml, info = dynamic_node({"nvmlDeviceCreateGpuInstanceWithPlacement": "NVML_ERROR_INSUFFICIENT_RESOURCES"})
    devices = WorkerDevices(info, (GpuSlot(0, 142, "1g", 5),), WorkerResources(mig_profile="1g"), False,
                            MigManager(info, nvml))
    run = ProcessRun(dump_env(tmp_path / "env.json"), {}, tmp_path / "w", devices=devices)
    with pytest.raises(OSError, match="cannot create GPU instance") as err:   # the agent reports exit 127
        await run.start()
    assert isinstance(err.value, MigError) and not (tmp_path / "env.json").exists()


async def test_a_command_that_cannot_start_releases_its_devices(tmp_path):
    nvml, info = dynamic_node()
    devices = WorkerDevices(info, (GpuSlot(0, 142, "1g", 5),), WorkerResources(mig_profile="1g"), False,
                            MigManager(info, nvml))
    run = ProcessRun((str(tmp_path / "no-such-command"),), {}, tmp_path / "w", devices=devices)
    with pytest.raises(OSError):
        await run.start()
    assert len(nvml.gpus[0].gis) == 2 and devices.created == {}
