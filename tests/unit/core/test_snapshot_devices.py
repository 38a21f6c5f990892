"""Snapshots carry the device state: MIG modes, instances and profiles, dynamic MIG and
MPS flags, the fit flags computed at registration, and GPU memory booked by shares."""
from __future__ import annotations

from dataclasses import replace

from gpusched.core import events as ev
from gpusched.core.digest import digest
from gpusched.core.model import GpuSlot, MigInstance, MigMode, MigProfileInfo, WorkerAssignment
from gpusched.core.snapshot import snapshot_bytes, state_from_snapshot

from .builders import Log, make_node, make_spec


def test_device_state_survives_a_snapshot():
    base = make_node("n1", gpus=2, model="H100-80GB")
    on = replace(base.gpus[0], mig_mode=MigMode.ENABLED,
                 mig_instances=(MigInstance("3g.40gb", 0, "MIG-a", 40_192, 4, 9, 1, 0),),
                 mig_profiles=(MigProfileInfo("3g.40gb", 9, 3, 40_192, 2),))
    off = replace(base.gpus[1], mig_mode=MigMode.DISABLED)
    log = Log(replace(base, gpus=(on, off), dynamic_mig=True, mps=True))
    share = replace(make_spec(milli=300), resources=replace(make_spec(milli=300).resources, gpu_memory_mib=9_000))
    assert log.submit("s", share).accepted
    assert log(ev.JobPlaced, job_id="s", attempt=0, workers=(WorkerAssignment(0, "n1", (GpuSlot(1, 300),)),)).accepted
    restored = state_from_snapshot(snapshot_bytes(log.state))
    assert digest(restored) == digest(log.state)
    a, b = log.state.nodes["n1"], restored.nodes["n1"]
    assert b.info == a.info
    for x, y in zip(a.gpus, b.gpus):
        assert (y.used_memory_mib, y.whole_ok, y.mig_slots, y.used_milli) == \
            (x.used_memory_mib, x.whole_ok, x.mig_slots, x.used_milli)
    assert b.gpus[1].used_memory_mib == 9_000 and not b.gpus[0].whole_ok
