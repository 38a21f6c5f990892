"""A small fake of pynvml (``FakeNvml``) over a table of boards and MIG devices."""
from __future__ import annotations

from types import SimpleNamespace


MIB = 2**20


class FakeNvml:
    """The pynvml functions the sampler calls, over a table of boards and MIG devices."""

    class NVMLError(Exception):
        pass

    def __init__(self, boards: dict[int, dict], migs: dict[int, list[dict]] | None = None) -> None:
        self.boards = boards
        self.migs = migs or {}
        self.initialised = 0

    def nvmlInit(self):
        self.initialised += 1

    def nvmlShutdown(self):
        self.initialised -= 1

    def nvmlDeviceGetHandleByIndex(self, i):
        return ("gpu", i)

    def _value(self, handle, name):
        kind, *where = handle
        table = self.boards[where[0]] if kind == "gpu" else self.migs[where[0]][where[1]]
        value = table.get(name)
        if value is None:
            raise self.NVMLError("Not Supported")
        return value

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=self._value(h, "sm"), memory=0)

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(used=self._value(h, "used_mib") * MIB, total=80_000 * MIB)

    def nvmlDeviceGetPowerUsage(self, h):
        return self._value(h, "power_mw")

    def nvmlDeviceGetUUID(self, h):
        return self._value(h, "uuid").encode()

    def nvmlDeviceGetMaxMigDeviceCount(self, h):
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h, i):
        if i >= len(self.migs.get(h[1], [])):
            raise self.NVMLError("Not Found")
        return ("mig", h[1], i)

    def nvmlDeviceGetGpuInstanceId(self, mig):
        return 10 + mig[2]

    def nvmlDeviceGetGpuInstanceById(self, parent, gi):
        return (parent[1], gi - 10)

    def nvmlGpuInstanceGetInfo(self, instance):
        start = self.migs[instance[0]][instance[1]]["start"]
        return SimpleNamespace(placement=SimpleNamespace(start=start, size=1))
