"""The devices a real worker gets: which GPUs or MIG devices it sees, and its MPS limits.

``device_env`` is pure: the environment a worker's slots give it. A whole GPU or a share
is named by the GPU's UUID, a MIG slice by its MIG device's UUID (``MIG-...``): CUDA
cannot use a MIG-enabled GPU by its GPU UUID. A share on a node running the CUDA MPS
daemon also gets MPS's limits — its compute share (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``)
and its GPU memory (``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``); without MPS nothing isolates
shares (docs/guide/devices.md).

``MigManager`` creates and destroys MIG instances through NVML for dynamic MIG, and
``WorkerDevices`` ties both to one worker's run: instances made before it starts, gone
before its end is reported (so the scheduler frees the slices only once they are free).
"""
from __future__ import annotations

import ctypes
import logging
import math
import os
from pathlib import Path
from typing import Mapping

from gpusched.core.mig import parse_profile
from gpusched.core.model import GpuInfo, GpuSlot, MigInstance, NodeInfo, WorkerResources

log = logging.getLogger("gpusched.node_agent.devices")
MIB = 1024 * 1024


class DeviceError(OSError):
    """A worker's devices cannot be set up. An OSError, so the agent reports the worker
    as unable to start (exit 127, with this message) like a missing command."""


class MigError(DeviceError):
    pass


def existing_instance(gpu: GpuInfo, slot: GpuSlot) -> MigInstance | None:
    """The registered MIG instance a slot stands for: same start, same compute slices."""
    want = parse_profile(slot.mig_profile)
    for inst in gpu.mig_instances:
        if inst.start == slot.mig_start and parse_profile(inst.profile) == want:
            return inst
    return None


def device_env(info: NodeInfo, slots: tuple[GpuSlot, ...], resources: WorkerResources, mps: bool,
               created: Mapping[tuple[int, int], str] | None = None) -> dict[str, str]:
    """CUDA_VISIBLE_DEVICES (and MPS limits for a share) for a worker's slots. ``created``
    maps (GPU index, MIG start) to the UUID of an instance made for this worker."""
    names = []
    for s in slots:
        gpu = info.gpus[s.index]
        if not s.mig_profile:
            names.append(gpu.uuid)
            continue
        uuid = (created or {}).get((s.index, s.mig_start))
        if uuid is None:
            inst = existing_instance(gpu, s)
            if inst is None:
                raise MigError(f"GPU {s.index} has no MIG instance {s.mig_profile} at slice {s.mig_start}")
            uuid = inst.uuid
        names.append(uuid)
    env = {"CUDA_VISIBLE_DEVICES": ",".join(names)}
    if mps and resources.gpu_milli > 0 and resources.gpus == 0:   # a share under MPS
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max(1, math.ceil(resources.gpu_milli / 10)))
        if resources.gpu_memory_mib > 0:
            # device ordinal 0: the share's one GPU, as the worker sees it
            env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={resources.gpu_memory_mib}M"
    return env


def load_nvml(fake_spec: str = ""):
    """The NVML module the agent calls: a FakeNvml from a spec file (a test harness), or
    None for the real ``pynvml``. Raises ValueError for a bad spec."""
    if not fake_spec:
        return None
    from gpusched.adapters.gpus.fake_nvml import FakeNvml
    return FakeNvml.from_file(fake_spec)


def mps_running(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether an MPS control daemon serves this machine: its pipe directory holds a
    ``control`` socket (CUDA_MPS_PIPE_DIRECTORY, default /tmp/nvidia-mps)."""
    pipes = Path(environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps"))
    return (pipes / "control").exists()


# Compute instance profile spanning a whole GPU instance of N compute slices.
_CI_PROFILES = {1: "NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE", 2: "NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE",
                3: "NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE", 4: "NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE",
                7: "NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE"}


class MigManager:
    """Dynamic MIG: creates a GPU instance and its compute instance for a slot, and
    destroys them again. Only instances it created are ever destroyed."""

    def __init__(self, info: NodeInfo, nvml=None) -> None:
        if nvml is None:
            import pynvml as nvml
        self.info = info
        self.nvml = nvml
        self.created: dict[str, tuple[int, int, int]] = {}   # MIG UUID -> (GPU, GI id, CI id)

    def create(self, slot: GpuSlot) -> str:
        """A new MIG device for ``slot``; its UUID. Raises MigError."""
        nvml = self.nvml
        gpu = self.info.gpus[slot.index]
        profile = self._profile(gpu, slot)
        size = self._slices(profile, gpu, parse_profile(slot.mig_profile).width)
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            raise MigError(f"NVML unavailable: {exc}") from exc
        try:
            h = nvml.nvmlDeviceGetHandleByIndex(slot.index)
            placement = nvml.c_nvmlGpuInstancePlacement_t(slot.mig_start, size)
            gi = self._step("create GPU instance", nvml.nvmlDeviceCreateGpuInstanceWithPlacement,
                            h, profile.profile_id, ctypes.byref(placement))
            try:
                ci_profile = getattr(nvml, _CI_PROFILES[profile.compute])
                ci_info = self._step("read compute profile", nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo,
                                     gi, ci_profile, nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
                ci = self._step("create compute instance", nvml.nvmlGpuInstanceCreateComputeInstance, gi, ci_info.id)
            except MigError:
                self._quiet(nvml.nvmlGpuInstanceDestroy, gi)   # leave no half-made instance
                raise
            gi_id = int(nvml.nvmlGpuInstanceGetInfo(gi).id)
            ci_id = int(nvml.nvmlComputeInstanceGetInfo(ci).id)
            uuid = self._uuid_of(h, gi_id, ci_id)
            self.created[uuid] = (slot.index, gi_id, ci_id)
            return uuid
        finally:
            nvml.nvmlShutdown()

    def destroy(self, uuid: str) -> None:
        """Destroy an instance ``create`` made (compute instance, then GPU instance)."""
        if uuid not in self.created:
            raise MigError(f"{uuid} was not created here; refusing to destroy it")
        nvml = self.nvml
        index, gi_id, ci_id = self.created[uuid]
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            raise MigError(f"NVML unavailable: {exc}") from exc
        try:
            h = nvml.nvmlDeviceGetHandleByIndex(index)
            gi = self._step("find GPU instance", nvml.nvmlDeviceGetGpuInstanceById, h, gi_id)
            try:
                ci = nvml.nvmlGpuInstanceGetComputeInstanceById(gi, ci_id)
            except nvml.NVMLError:   # gone already: an earlier try destroyed it, then failed
                ci = None
            if ci is not None:
                self._step("destroy compute instance", nvml.nvmlComputeInstanceDestroy, ci)
            self._step("destroy GPU instance", nvml.nvmlGpuInstanceDestroy, gi)
            del self.created[uuid]
        finally:
            nvml.nvmlShutdown()

    def _profile(self, gpu: GpuInfo, slot: GpuSlot):
        """The NVML profile for a slot: the one named exactly ('1g.20gb'), else the one
        with that many compute slices and the least memory ('1g' -> '1g.10gb')."""
        want = parse_profile(slot.mig_profile)
        if want is None:
            raise MigError(f"unknown MIG profile {slot.mig_profile!r}")
        exact = [p for p in gpu.mig_profiles if p.name == slot.mig_profile]
        same = sorted((p for p in gpu.mig_profiles if p.compute == want.compute), key=lambda p: p.memory_mib)
        if not (exact or same):
            raise MigError(f"GPU {gpu.index} offers no MIG profile {slot.mig_profile} (is MIG enabled?)")
        return (exact or same)[0]

    @staticmethod
    def _slices(profile, gpu: GpuInfo, width: int) -> int:
        """Memory slices (NVML placement size) of a profile: the scheduler's width, but 2
        for the double-memory 1g profile (1g.20gb on an 80 GB GPU), told apart by its
        memory against an eighth of the GPU's."""
        if profile.compute == 1 and profile.memory_mib > gpu.memory_mib / 8 * 1.5:
            return 2
        return width

    def _uuid_of(self, h, gi_id: int, ci_id: int) -> str:
        nvml = self.nvml
        for i in range(nvml.nvmlDeviceGetMaxMigDeviceCount(h)):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, i)
            except nvml.NVMLError:
                continue
            if nvml.nvmlDeviceGetGpuInstanceId(mig) == gi_id and nvml.nvmlDeviceGetComputeInstanceId(mig) == ci_id:
                uuid = nvml.nvmlDeviceGetUUID(mig)
                return uuid.decode() if isinstance(uuid, bytes) else str(uuid)
        raise MigError(f"created GPU instance {gi_id} / compute instance {ci_id} has no MIG device")

    def _step(self, what: str, fn, *args):
        try:
            return fn(*args)
        except self.nvml.NVMLError as exc:
            raise MigError(f"cannot {what}: {exc}") from exc

    def _quiet(self, fn, *args) -> None:
        try:
            fn(*args)
        except self.nvml.NVMLError as exc:
            log.warning("MIG clean-up failed: %s", exc)


class WorkerDevices:
    """One worker's devices: ``acquire`` before its process starts (creates the MIG
    instances dynamic MIG needs, returns the env), ``release`` once it has ended."""

    def __init__(self, info: NodeInfo, slots: tuple[GpuSlot, ...], resources: WorkerResources, mps: bool,
                 mig: MigManager | None = None) -> None:
        self.info, self.slots, self.resources, self.mps, self.mig = info, slots, resources, mps, mig
        self.created: dict[tuple[int, int], str] = {}

    def acquire(self) -> dict[str, str]:
        try:
            for s in self.slots:
                if s.mig_profile and existing_instance(self.info.gpus[s.index], s) is None and self.mig is not None:
                    self.created[(s.index, s.mig_start)] = self.mig.create(s)
            return device_env(self.info, self.slots, self.resources, self.mps, self.created)
        except Exception:
            self.release()
            raise

    def release(self) -> None:
        for key, uuid in list(self.created.items()):
            try:
                self.mig.destroy(uuid)
            except MigError as exc:   # the slices stay cut; the next create there fails clearly
                log.error("destroying MIG instance %s failed: %s", uuid, exc)
            del self.created[key]
