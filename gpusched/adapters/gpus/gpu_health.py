"""GPU health watching: NVML's XID events and ECC counters, or a simulated NVML.

Both backends deliver ``GpuFault`` records on an asyncio queue; the node-agent turns
each into a ``GpuHealthChanged`` event. XIDs treated as fatal follow NVIDIA's XID
catalogue: 48 (double-bit ECC), 63/64 (row remapping), 74 (NVLink), 79 (fallen off the
bus), 92-95 (ECC / contained errors), 119/120 (GSP errors).
"""
from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass

log = logging.getLogger(__name__)
FATAL_XIDS = frozenset({48, 63, 64, 74, 79, 92, 94, 95, 119, 120})


@dataclass(frozen=True, slots=True)
class GpuFault:
    gpu_index: int
    reason: str
    xid: int = 0


class SimulatedNvml:
    """The simulated backend: faults arrive by injection (the agent's gRPC API)."""

    name = "simulated"

    def __init__(self) -> None:
        self.faults: asyncio.Queue[GpuFault] = asyncio.Queue()

    def inject(self, gpu_index: int, xid: int, ecc: bool) -> None:
        if ecc:
            fault = GpuFault(gpu_index, "uncorrectable ECC error (simulated NVML)", 48)
        else:
            fault = GpuFault(gpu_index, f"XID {xid} (simulated NVML)", xid)
        self.faults.put_nowait(fault)

    async def start(self) -> None:
        return None

    def stop(self) -> None:
        return None


class NvmlWatch:
    """Waits on NVML's event set in a thread (the call blocks) and polls ECC counters."""

    name = "nvml"

    def __init__(self, gpu_count: int, ecc_poll_s: float = 10.0, nvml=None) -> None:
        self._nvml = nvml   # the NVML module (pynvml unless a test gives a FakeNvml)
        self.faults: asyncio.Queue[GpuFault] = asyncio.Queue()
        self._gpu_count = gpu_count
        self._ecc_poll_s = ecc_poll_s
        self._stop = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        threading.Thread(target=self._watch, name="nvml-watch", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _emit(self, fault: GpuFault) -> None:
        self._loop.call_soon_threadsafe(self.faults.put_nowait, fault)

    def _watch(self) -> None:
        pynvml = self._nvml
        if pynvml is None:
            import pynvml

        pynvml.nvmlInit()
        try:
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(self._gpu_count)]
            events = pynvml.nvmlEventSetCreate()
            for h in handles:
                try:
                    pynvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, events)
                except pynvml.NVMLError as exc:   # e.g. NOT_SUPPORTED in some VMs
                    log.warning("XID events unavailable: %s", exc)
            ecc_seen = [self._ecc(pynvml, h) for h in handles]
            while not self._stop.is_set():
                self._wait_xid(pynvml, events, handles)
                for i, h in enumerate(handles):
                    count = self._ecc(pynvml, h)
                    if count > ecc_seen[i]:
                        ecc_seen[i] = count
                        self._emit(GpuFault(i, f"uncorrectable ECC errors: {count}", 48))
        finally:
            pynvml.nvmlShutdown()

    def _wait_xid(self, pynvml, events, handles) -> None:
        try:
            data = pynvml.nvmlEventSetWait_v2(events, int(self._ecc_poll_s * 1000))
        except pynvml.NVMLError_Timeout:
            return
        except pynvml.NVMLError as exc:
            log.warning("NVML event wait failed: %s", exc)
            self._stop.wait(self._ecc_poll_s)
            return
        xid = int(data.eventData)
        if xid in FATAL_XIDS:
            index = next((i for i, h in enumerate(handles) if _same(pynvml, h, data.device)), -1)
            self._emit(GpuFault(index, f"XID {xid}", xid))

    @staticmethod
    def _ecc(pynvml, handle) -> int:
        try:
            return int(pynvml.nvmlDeviceGetTotalEccErrors(
                handle, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC))
        except pynvml.NVMLError:
            return 0


def _same(pynvml, a, b) -> bool:
    try:
        return pynvml.nvmlDeviceGetUUID(a) == pynvml.nvmlDeviceGetUUID(b)
    except pynvml.NVMLError:
        return False
