"""One fit rule: what the policies choose with (``GpuState.fits_whole``, ``fits_share``,
``fits_mig``) is exactly what ``core.capacity`` accepts, on every path, whatever the GPU's
MIG mode (MIXED, off, on with instances, dynamic), its allocations, health, and the
share's GPU-memory request."""
from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.core import capacity
from gpusched.core.mig import PROFILES
from gpusched.core.model import GpuSlot, MigMode, WorkerAssignment

from .builders import make_spec
from .fit_cases import INSTANCE_SETS, gpu_st, requests, build


@settings(max_examples=800, deadline=None)
@given(gpus=st.lists(gpu_st, min_size=1, max_size=2), model=st.sampled_from(["H100-80GB", "L40S-48GB"]),
       dynamic=st.booleans(), request=requests, data=st.data())
def test_choosing_and_verifying_agree(gpus, model, dynamic, request, data):
    state = build(gpus, model, dynamic)
    node = state.nodes["n1"]
    index = data.draw(st.integers(0, len(gpus) - 1))
    gpu = node.gpus[index]
    kind, a, b = request
    if kind == "whole":
        spec, slot, chosen = make_spec(gpus=1), GpuSlot(index), gpu.fits_whole()
    elif kind == "share":
        spec = replace(make_spec(milli=a), resources=replace(make_spec(milli=a).resources, gpu_memory_mib=b))
        slot, chosen = GpuSlot(index, a), gpu.fits_share(a, b)
    else:
        profile = PROFILES[a]
        if b not in profile.starts:
            b = profile.starts[-1]
        spec, slot, chosen = make_spec(mig=a), GpuSlot(index, profile.milli, a, b), gpu.fits_mig(profile, b)
        assert not chosen or gpu.takes_mig(), "takes_mig must not refuse a GPU fits_mig accepts"
    worker = WorkerAssignment(0, "n1", (slot,))
    verdicts = {capacity._check_one(state, spec, worker),
                capacity._check_on_distinct_nodes(state, spec, (worker,)),
                capacity._check_sharing_nodes(state, spec, (worker,))}
    assert len(verdicts) == 1, verdicts
    assert (verdicts.pop() == "") == chosen


def test_examples_of_each_mode():
    def one(mode, instances=(), dynamic=False):
        state = build([{"mode": mode, "instances": instances, "healthy": True, "used_milli": 0, "mig_mask": 0,
                        "used_memory": 0}], "H100-80GB", dynamic)
        return state.nodes["n1"].gpus[0]
    mixed, off, on = one(MigMode.MIXED), one(MigMode.DISABLED), one(MigMode.ENABLED, INSTANCE_SETS[2])
    dyn = one(MigMode.ENABLED, INSTANCE_SETS[2], dynamic=True)
    p1, p3 = PROFILES["1g"], PROFILES["3g"]
    assert mixed.fits_whole() and mixed.fits_share(500) and mixed.fits_mig(p1, 5)
    assert off.fits_whole() and off.fits_share(500) and not off.fits_mig(p1, 0) and not off.takes_mig()
    assert not on.fits_whole() and not on.fits_share(500)
    assert on.fits_mig(p3, 0) and on.fits_mig(p1, 4) and not on.fits_mig(p1, 5)   # only its instances
    assert on.fits_mig(p1, 6)           # the 1g.20gb instance at 6 (slices 6-7)
    assert dyn.fits_mig(p1, 5) and not dyn.fits_mig(p1, 7)   # free slice 5; 7 is the 1g.20gb's
    assert not one(MigMode.ENABLED).takes_mig()              # MIG on, no instance, static: nothing
    assert one(MigMode.ENABLED, dynamic=True).fits_mig(PROFILES["7g"], 0)
    share = one(MigMode.MIXED)
    share.used_milli, share.used_memory_mib = 300, 60_000
    assert share.fits_share(300, 20_000) and not share.fits_share(300, 30_000) and share.fits_share(300)


@settings(max_examples=400, deadline=None)
@given(gpus=st.lists(gpu_st, min_size=1, max_size=3), model=st.sampled_from(["H100-80GB", "L40S-48GB"]),
       dynamic=st.booleans(), memory=st.sampled_from([1, 10_000, 45_000, 80_000]))
def test_offered_gpus_mirror_the_share_rule(gpus, model, dynamic, memory):
    """What placement's node mirror reads of each GPU (``capacity.offered_gpus``): the
    largest share ``fits_share`` takes there, and the GPU memory a share of one milli
    may ask for; 0 and 0 where it takes none."""
    node = build(gpus, model, dynamic).nodes["n1"]
    free, free_memory = capacity.offered_gpus(node)
    assert len(free) == len(free_memory) == len(node.gpus)
    for g, f, m in zip(node.gpus, free, free_memory):
        assert g.fits_share(f + 1) is False
        assert (f > 0) == g.fits_share(1) and (f == 0 or g.fits_share(f))
        if f:
            assert g.fits_share(1, m) and not g.fits_share(1, m + 1)
            assert g.fits_share(1, memory) == (memory <= m)
        else:
            assert m == 0 or g.fits_share(1) is False and g.used_milli == 1000
