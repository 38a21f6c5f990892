"""The node-agent's NVML inventory and health watch, run once on a machine with real GPUs,
beside the simulated backend they must agree with. Prints a report (and writes it as JSON
to $OUT/gpu_check.json when $OUT is set).

Read only: it never changes a GPU's MIG mode, never creates or destroys MIG instances and
never resets a GPU. Per GPU it reports the MIG mode NVML gives (current and pending), the
existing GPU instances with their profiles, memory and MIG UUIDs, and NVML's profile table
(only readable with MIG enabled), and checks the inventory registers the current mode.

    PYTHONPATH=. python3 deploy/gpu_check.py [--watch-s 5] [--usage-samples 3] [--workload] [--torchrun]

(``--workload`` and ``--torchrun`` run through the agent's worker shim: build it first with
``python3 deploy/build_parts.py shim``, which needs only a C compiler.)

Needs only the NVIDIA driver and nvidia-ml-py (``pynvml``); no Kafka, no gRPC. What it
runs is the agent's own code: ``nvml_gpus()`` (what a node registers with) and
``NvmlWatch`` (XID events and ECC counters), as ``gpusched-node-agent`` builds them,
and ``NvmlSampler`` (the usage records' SM utilization, memory and power): a few samples
of every GPU as a whole-GPU worker, read only, plus what NVML answers for the MIG
devices that exist (no per-instance SM utilization). ``--workload`` also runs a real CUDA workload (PyTorch) through the agent's
``ProcessRun`` on GPU 0: it must see only that GPU, checkpoint, stop gracefully on the
preemption signal within the grace period, and resume from its checkpoint; the usage
sampler reads GPU 0 meanwhile and must see it busy. ``--torchrun`` runs a two-process
``torchrun`` job on GPU 0 with the environment the node-agent gives a worker
(docs/guide/workloads.md): both ranks must meet, all-reduce, and see exactly that GPU.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib.util
import json
import os
import platform
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pynvml  # noqa: E402

from gpusched.adapters.gpus.gpu_health import FATAL_XIDS, NvmlWatch, SimulatedNvml  # noqa: E402
from gpusched.adapters.gpus.gpu_inventory import (  # noqa: E402
    InventoryError, mig_instances, mig_mode, mig_profiles, nvml_gpus, simulated_gpus,
)
from gpusched.adapters.gpus.gpu_usage import NvmlSampler, RunningWorker  # noqa: E402
from gpusched.core.catalog import CATALOG  # noqa: E402
from gpusched.core.model import GpuSlot, MigMode, NodeInfo, WorkerResources  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

# A training-like workload: matrix products on the GPU it is given, a checkpoint every
# half second (the agent's file protocol), a last one on SIGTERM, resume from
# GPUSCHED_RESUME_FROM.
WORKLOAD = r"""
import json, os, signal, sys, time
import torch
stop = False
def on_term(*_):
    global stop
    stop = True
signal.signal(signal.SIGTERM, on_term)
resume = os.environ.get("GPUSCHED_RESUME_FROM", "")
done = float(resume.rsplit("@", 1)[1]) if "@" in resume else 0.0
total = float(sys.argv[1])
props = torch.cuda.get_device_properties(0)
with open("gpu.json", "w") as f:   # cwd: the attempt's work folder
    json.dump({"visible": torch.cuda.device_count(), "name": props.name,
               "uuid": "GPU-" + str(props.uuid), "resumed_from": done}, f)
a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
t0, last = time.monotonic(), 0.0
def checkpoint(progress):
    with open(os.environ["GPUSCHED_CHECKPOINT_FILE"], "w") as f:
        f.write(f"ckpt://{os.getpid()}@{progress:.3f} {progress:.3f}")
while not stop:
    progress = done + time.monotonic() - t0
    if progress >= total:
        checkpoint(total)
        sys.exit(0)
    for _ in range(20):
        a = (a @ a).clamp_(-1, 1)
    torch.cuda.synchronize()
    if progress - last >= 0.5:
        checkpoint(progress)
        last = progress
checkpoint(done + time.monotonic() - t0)
sys.exit(143)
"""


def _agent_module(name: str):
    """services/node-agent/<name>.py, without installing the package."""
    spec = importlib.util.spec_from_file_location(f"agent_{name}", REPO / f"services/node-agent/{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module   # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


async def workload(inventory, total_s: float = 6.0, grace_s: float = 10.0) -> dict:
    """Preempt a real workload mid-run on GPU 0 (given as the agent gives it: through
    ``devices.WorkerDevices``), then resume it from its checkpoint."""
    import tempfile
    runner, devices = _agent_module("runner"), _agent_module("devices")
    info = NodeInfo("gpu-check", "default", 0, 0, tuple(inventory))

    def gpu0():
        return devices.WorkerDevices(info, (GpuSlot(0),), WorkerResources(gpus=1), False)
    work = Path(tempfile.mkdtemp(prefix="gpusched-gpucheck-"))
    (work / "train.py").write_text(WORKLOAD)
    command = (sys.executable, str(work / "train.py"), str(total_s))
    seen: list[tuple[str, float]] = []

    async def on_checkpoint(location: str, progress: float) -> None:
        seen.append((location, progress))

    first = runner.ProcessRun(command, {}, work / "attempt-0", on_checkpoint, devices=gpu0())
    await first.start()
    waiting = asyncio.create_task(first.wait())
    # preempt once it runs on the GPU and has checkpointed (importing torch takes seconds)
    deadline = time.monotonic() + 120
    while not (len(seen) >= 2 and (work / "attempt-0" / "gpu.json").exists()):
        if waiting.done() or time.monotonic() > deadline:
            raise RuntimeError(f"workload did not start: exit {waiting.result() if waiting.done() else '?'}")
        await asyncio.sleep(0.1)
    t0 = time.monotonic()
    await first.stop(grace_s)
    code = (await waiting).exit_code
    stopped_s = time.monotonic() - t0
    checkpoint = seen[-1] if seen else ("", 0.0)
    second = runner.ProcessRun(command, {"GPUSCHED_RESUME_FROM": checkpoint[0]}, work / "attempt-1",
                               on_checkpoint, devices=gpu0())
    await second.start()
    code2 = (await second.wait()).exit_code
    seen_by = [json.loads((work / f"attempt-{i}" / "gpu.json").read_text()) for i in (0, 1)]
    return {"total_s": total_s, "cuda_visible_devices": first.env["CUDA_VISIBLE_DEVICES"], "workload_saw": seen_by,
            "attempt0_exit": code, "expected_exit": runner.EXIT_TERMINATED,
            "stopped_within_s": round(stopped_s, 2), "checkpoints": len(seen),
            "attempt0_last_checkpoint": checkpoint, "attempt1_exit": code2,
            "final_progress": seen[-1][1] if seen else None}


# Each torchrun process: a gloo all-reduce of the ranks (NCCL refuses two ranks on one
# GPU), and a CUDA tensor on the one GPU the agent made visible.
TORCHRUN_WORKER = r"""
import json, os
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
total = torch.tensor([dist.get_rank()])
dist.all_reduce(total)
x = torch.ones(1024, device="cuda").sum().item()
with open(f"rank-{dist.get_rank()}.json", "w") as f:
    json.dump({"rank": dist.get_rank(), "world": dist.get_world_size(), "rank_sum": int(total.item()),
               "local_rank": int(os.environ["LOCAL_RANK"]), "visible": torch.cuda.device_count(),
               "cuda_sum": x, "rdzv": os.environ.get("GPUSCHED_RDZV_ID")}, f)
dist.destroy_process_group()
"""


async def torchrun_job(inventory, procs: int = 2) -> dict:
    """One worker of one GPU that runs ``torchrun`` with the environment the node-agent
    builds (``launch_env.worker_env``), through the agent's ``ProcessRun`` and shim, as
    docs/guide/workloads.md's example does on many nodes."""
    import socket
    import tempfile

    from gpusched.core.model import JobSpec, WorkerAssignment
    from gpusched.core.state import JobState, NodeState
    runner, devices, launch_env = _agent_module("runner"), _agent_module("devices"), _agent_module("launch_env")
    work = Path(tempfile.mkdtemp(prefix="gpusched-torchrun-"))
    (work / "worker.py").write_text(TORCHRUN_WORKER)
    node = NodeState(NodeInfo("gpu-check", "default", 0, 0, tuple(inventory), address="127.0.0.1"), [])
    job = JobState("torchrun-check", JobSpec(name="t", team="t", resources=WorkerResources(gpus=1)), 0, 0.0)
    job.workers = (WorkerAssignment(0, node.name, (GpuSlot(0),)),)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = launch_env.worker_env(job, 0, launch_env.node_addresses(job, {node.name: node}), f"127.0.0.1:{port}")
    command = ("sh", "-c", f"exec {sys.executable} -m torch.distributed.run --nnodes=$GPUSCHED_NNODES "
                           f"--node-rank=$NODE_RANK --nproc-per-node={procs} --rdzv-backend=c10d "
                           f"--rdzv-endpoint=$GPUSCHED_RDZV_ENDPOINT --rdzv-id=$GPUSCHED_RDZV_ID {work / 'worker.py'}")
    gpu0 = devices.WorkerDevices(node.info, (GpuSlot(0),), WorkerResources(gpus=1), False)
    run = runner.ProcessRun(command, env, work / "attempt-0", devices=gpu0)
    await run.start()
    end = await asyncio.wait_for(run.wait(), 300)
    ranks = [json.loads(p.read_text()) for p in sorted((work / "attempt-0").glob("rank-*.json"))]
    return {"exit_code": end.exit_code, "env": {k: env[k] for k in ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK",
                                                                   "GPUSCHED_NNODES", "GPUSCHED_RDZV_ID")},
            "ranks": ranks, "procs": procs}


def torchrun_ok(t: dict) -> bool:
    procs = t["procs"]
    return t["exit_code"] == 0 and len(t["ranks"]) == procs and all(
        r["world"] == procs and r["rank_sum"] == procs * (procs - 1) // 2 and r["visible"] == 1
        and r["cuda_sum"] == 1024.0 for r in t["ranks"])


def _whole_gpu_workers(inventory) -> list:
    return [RunningWorker(f"gpu-{g.index}", 0, 0, "gpu_check", "training", (GpuSlot(g.index),)) for g in inventory]


def usage_samples(inventory, count: int, interval_s: float, nvml=pynvml) -> dict:
    """The agent's NvmlSampler, read only: ``count`` rounds, each GPU as one whole-GPU
    worker; and what NVML answers for each MIG device (utilization: expected NOT_SUPPORTED)."""
    sampler = NvmlSampler(nvml, inventory)
    workers = _whole_gpu_workers(inventory)
    rounds = []
    sampler.start()
    try:
        for i in range(count):
            if i:
                time.sleep(interval_s)   # the sampling period under test
            readings = sampler.read(workers)
            rounds.append({"time": time.time(),
                           "gpus": [dataclasses.asdict(readings[w.key][0]) for w in workers if readings[w.key]]})
        handles = [sampler._handles[g.index] for g in inventory]
        mig_enabled = [g.index for g, h in zip(inventory, handles) if _ask(nvml, _mig_mode, nvml, h) == 1]
        mig = [d for g, h in zip(inventory, handles) for d in _mig_devices(nvml, g.index, h)]
    finally:
        sampler.close()
    return {"interval_s": interval_s, "rounds": rounds, "mig_enabled": mig_enabled, "mig_devices": mig}


def _mig_mode(nvml, handle) -> int:
    return nvml.nvmlDeviceGetMigMode(handle)[0]   # (current, pending)


def _mig_devices(nvml, index: int, parent) -> list[dict]:
    out = []
    count = _ask(nvml, nvml.nvmlDeviceGetMaxMigDeviceCount, parent)
    for i in range(count if isinstance(count, int) else 0):
        device = _ask(nvml, nvml.nvmlDeviceGetMigDeviceHandleByIndex, parent, i)
        if isinstance(device, str) and device.startswith("error:"):
            continue   # no MIG device in this slot
        out.append({"gpu": index, "mig_device": i, "uuid": _ask(nvml, nvml.nvmlDeviceGetUUID, device),
                    "utilization": _ask(nvml, lambda d: nvml.nvmlDeviceGetUtilizationRates(d).gpu, device),
                    "memory_used_mib": _ask(nvml, lambda d: nvml.nvmlDeviceGetMemoryInfo(d).used // 2**20, device)})
    return out


def _ask(nvml, fn, *args):
    """``_call`` for any NVML module (tests pass a fake)."""
    try:
        value = fn(*args)
    except nvml.NVMLError as exc:
        return f"error: {exc}"
    return value.decode() if isinstance(value, bytes) else value


def usage_ok(usage: dict, gpu_count: int) -> bool:
    """Every round read every GPU's memory, and the SM utilization (0..100) of every GPU
    not in MIG mode (NVML gives none for a GPU cut into instances)."""
    def fine(g: dict) -> bool:
        sm_ok = g["sm_percent"] == -1 if g["index"] in usage["mig_enabled"] else 0 <= g["sm_percent"] <= 100
        return sm_ok and g["memory_used_mib"] >= 0
    return len(usage["rounds"]) > 0 and all(
        len(r["gpus"]) == gpu_count and all(fine(g) for g in r["gpus"]) for r in usage["rounds"])


async def busy_while(inventory, running: asyncio.Task, interval_s: float = 0.5) -> list[float]:
    """GPU 0's SM utilization as the usage sampler reads it, until ``running`` ends."""
    sampler = NvmlSampler(pynvml, inventory[:1])
    worker = _whole_gpu_workers(inventory[:1])
    seen = []
    sampler.start()
    try:
        while not running.done():
            [sample] = (await asyncio.to_thread(sampler.read, worker))[worker[0].key]
            seen.append(sample.sm_percent)
            await asyncio.wait([running], timeout=interval_s)
    finally:
        sampler.close()
    return seen


async def workload_with_usage(inventory) -> dict:
    running = asyncio.create_task(workload(inventory))
    seen = await busy_while(inventory, running)
    return {**running.result(), "sm_percent_seen": seen}


def _call(fn, *args):
    """NVML's answer, or the name of the error it gave (NOT_SUPPORTED in VMs, say)."""
    try:
        value = fn(*args)
    except pynvml.NVMLError as exc:
        return f"error: {exc}"
    return value.decode() if isinstance(value, bytes) else value


def raw_facts() -> dict:
    pynvml.nvmlInit()
    try:
        facts = {"driver": _call(pynvml.nvmlSystemGetDriverVersion),
                 "nvml": _call(pynvml.nvmlSystemGetNVMLVersion),
                 "cuda_driver": _call(pynvml.nvmlSystemGetCudaDriverVersion), "gpus": []}
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            events = _call(pynvml.nvmlDeviceGetSupportedEventTypes, h)
            facts["gpus"].append({
                "index": i, "name": _call(pynvml.nvmlDeviceGetName, h), "uuid": _call(pynvml.nvmlDeviceGetUUID, h),
                "memory_mib": pynvml.nvmlDeviceGetMemoryInfo(h).total // 2**20,
                "mig_mode_current_pending": _call(pynvml.nvmlDeviceGetMigMode, h),
                "ecc_mode_current_pending": _call(pynvml.nvmlDeviceGetEccMode, h),
                "ecc_uncorrected_volatile": _call(pynvml.nvmlDeviceGetTotalEccErrors, h,
                                                  pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                                  pynvml.NVML_VOLATILE_ECC),
                "xid_events_supported": (bool(events & pynvml.nvmlEventTypeXidCriticalError)
                                         if isinstance(events, int) else events),
                "pci_bus_id": _call(lambda d: pynvml.nvmlDeviceGetPciInfo(d).busId, h),
                "temperature_c": _call(pynvml.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU),
            })
        return facts
    finally:
        pynvml.nvmlShutdown()


def mig_report(nvml=pynvml) -> list[dict]:
    """Per GPU: MIG mode (current/pending), existing instances, NVML's profile table. Calls
    only NVML's Get functions (the inventory's own readers), so it changes nothing."""
    nvml.nvmlInit()
    try:
        out = []
        for i in range(nvml.nvmlDeviceGetCount()):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            gpu: dict = {"index": i, "mig_mode_current_pending": _call(nvml.nvmlDeviceGetMigMode, h)}
            mode = mig_mode(nvml, h)
            gpu["mig"] = "not supported" if mode is None else mode.value
            if mode is MigMode.ENABLED:
                profiles = mig_profiles(nvml, h)
                gpu["profiles"] = [dataclasses.asdict(p) for p in profiles]
                try:
                    gpu["instances"] = [dataclasses.asdict(m) for m in mig_instances(nvml, h, profiles)]
                except InventoryError as exc:
                    gpu["instances"] = f"error: {exc}"
            out.append(gpu)
        return out
    finally:
        nvml.nvmlShutdown()


def mig_agrees(report: list[dict], inventory) -> list[str]:
    """Where the registered inventory's MIG mode or instances differ from what NVML says."""
    diffs = []
    for gpu, info in zip(report, inventory):
        want = "disabled" if gpu["mig"] == "not supported" else gpu["mig"]
        if info.mig_mode.value != want:
            diffs.append(f"GPU {info.index} registers MIG {info.mig_mode.value}, NVML says {gpu['mig']}")
        instances = gpu.get("instances", [])
        uuids = [m["uuid"] for m in instances] if isinstance(instances, list) else instances
        if [m.uuid for m in info.mig_instances] != uuids:
            diffs.append(f"GPU {info.index} registers instances {[m.uuid for m in info.mig_instances]}, NVML {uuids}")
    return diffs


def compare_with_simulated(real) -> list[str]:
    """What a simulated node of the same shape would register differently (empty: none)."""
    if not real:
        return ["NVML reports no GPU"]
    models = {g.model for g in real}
    if len(models) != 1:
        return [f"mixed models {sorted(models)}: a simulated node has one"]
    model = real[0].model
    if model not in CATALOG:
        return [f"NVML model {model!r} is not in the catalog: a simulated node cannot be one"]
    diffs = []
    for r, s in zip(real, simulated_gpus(f"{len(real)}x{model}", "sim")):
        for field in ("index", "model", "memory_mib", "mig_capable"):
            if getattr(r, field) != getattr(s, field):
                diffs.append(f"GPU {r.index} {field}: NVML {getattr(r, field)!r}, simulated {getattr(s, field)!r}")
    return diffs


async def watch(gpu_count: int, seconds: float) -> dict:
    """NvmlWatch as the agent runs it, for a while; then it must stop when told."""
    backend = NvmlWatch(gpu_count, ecc_poll_s=1.0)
    await backend.start()
    faults = []
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        try:
            faults.append(await asyncio.wait_for(backend.faults.get(), left))
        except asyncio.TimeoutError:
            break
    alive_before = any(t.name == "nvml-watch" for t in threading.enumerate())
    backend.stop()
    t0 = time.monotonic()
    while any(t.name == "nvml-watch" for t in threading.enumerate()) and time.monotonic() - t0 < 5:
        await asyncio.sleep(0.05)
    stopped = not any(t.name == "nvml-watch" for t in threading.enumerate())
    return {"seconds": seconds, "faults": [dataclasses.asdict(f) for f in faults],
            "thread_ran": alive_before, "stopped_within_s": round(time.monotonic() - t0, 2) if stopped else None}


async def simulated_fault_shape() -> dict:
    """What the simulated backend delivers for an injected XID 79, the record the agent
    turns into GpuHealthChanged (the real watch emits GpuFault(index, 'XID 79', 79))."""
    sim = SimulatedNvml()
    sim.inject(0, 79, ecc=False)
    fault = await sim.faults.get()
    return {**dataclasses.asdict(fault), "fatal": fault.xid in FATAL_XIDS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--watch-s", type=float, default=5.0)
    parser.add_argument("--usage-samples", type=int, default=3, help="rounds of usage samples (NVML, read only)")
    parser.add_argument("--usage-interval", type=float, default=1.0, help="seconds between usage rounds")
    parser.add_argument("--workload", action="store_true", help="also run a CUDA workload (needs PyTorch)")
    parser.add_argument("--torchrun", action="store_true",
                        help="also run a 2-process torchrun job on GPU 0 with the agent's environment (needs PyTorch)")
    args = parser.parse_args()
    report = {"host": platform.node(), "python": sys.version.split()[0], "kernel": platform.release(),
              "pynvml": getattr(pynvml, "__version__", "?"), "nvml": raw_facts()}
    inventory = nvml_gpus()
    report["inventory"] = [dataclasses.asdict(g) for g in inventory]
    report["simulated_differs"] = compare_with_simulated(inventory)
    report["mig"] = mig_report()
    report["mig_differs"] = mig_agrees(report["mig"], inventory)
    report["watch"] = asyncio.run(watch(len(inventory), args.watch_s))
    report["simulated_fault"] = asyncio.run(simulated_fault_shape())
    report["usage"] = usage_samples(inventory, max(1, args.usage_samples), args.usage_interval)
    mig_on_gpu0 = bool(inventory) and inventory[0].mig_mode is MigMode.ENABLED
    if args.workload and mig_on_gpu0:
        report["workload"] = "skipped: GPU 0 has MIG enabled (CUDA cannot use it whole)"
    elif args.workload:
        report["workload"] = asyncio.run(workload_with_usage(inventory))
    if args.torchrun and mig_on_gpu0:
        report["torchrun"] = "skipped: GPU 0 has MIG enabled (CUDA cannot use it whole)"
    elif args.torchrun:
        report["torchrun"] = asyncio.run(torchrun_job(inventory))
    text = json.dumps(report, indent=2, default=str)
    print(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "gpu_check.json").write_text(text)
    ok = inventory and not report["simulated_differs"] and not report["mig_differs"] \
        and report["watch"]["thread_ran"] and report["watch"]["stopped_within_s"] is not None \
        and usage_ok(report["usage"], len(inventory))
    if args.workload and not mig_on_gpu0:
        w = report["workload"]
        ok = ok and w["attempt0_exit"] == w["expected_exit"] and w["attempt1_exit"] == 0 \
            and w["checkpoints"] >= 2 and w["final_progress"] is not None and w["final_progress"] >= w["total_s"] \
            and all(g["visible"] == 1 and g["uuid"] == inventory[0].uuid for g in w["workload_saw"]) \
            and w["workload_saw"][1]["resumed_from"] > 0 and max(w["sm_percent_seen"], default=0) > 5
    if args.torchrun:
        ok = ok and torchrun_ok(report["torchrun"])
    print("gpu_check:", "OK" if ok else "MISMATCH OR FAILURE")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
