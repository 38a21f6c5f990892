"""Random jobs (``jobs_st``) and MIG set-ups (``MIG_SETUPS``, ``with_mig``) of nodes of the
``MODELS`` for the placement policies' property tests."""
from __future__ import annotations

from dataclasses import replace

from hypothesis import strategies as st

from gpusched.core.mig import PROFILES
from gpusched.core.model import MigInstance, MigMode, WorkerResources


MODELS = ("H100-80GB", "A10-24GB", "T4-16GB")

# MIG modes a node's GPUs register with: MIXED (simulated), MIG off, MIG on with
# existing instances (static), MIG on with dynamic MIG.
MIG_SETUPS = ("mixed", "mixed", "disabled", "static", "dynamic")
INSTANCES = (MigInstance("3g.40gb", 0, "MIG-a", slices=4), MigInstance("2g.20gb", 4, "MIG-b", slices=2),
             MigInstance("1g.10gb", 6, "MIG-c", slices=1))


resources_st = st.one_of(
    st.builds(lambda m, c: WorkerResources(gpu_milli=m, cpu_milli=c, memory_mib=c),
              st.integers(1, 999), st.sampled_from([0, 2000, 8000])),
    st.builds(lambda m, g: WorkerResources(gpu_milli=m, gpu_memory_mib=g, cpu_milli=1000),
              st.integers(1, 400), st.sampled_from([4000, 12_000, 30_000])),
    st.builds(lambda g, c, models: WorkerResources(gpus=g, cpu_milli=c, memory_mib=2 * c, gpu_models=models),
              st.integers(1, 4), st.sampled_from([0, 4000, 16_000]), st.sampled_from([(), ("A10-24GB",)])),
    st.builds(lambda p: WorkerResources(mig_profile=p, cpu_milli=1000), st.sampled_from(sorted(PROFILES))),
    st.builds(lambda c: WorkerResources(cpu_milli=c, memory_mib=c), st.sampled_from([1000, 12_000, 40_000])),
)
jobs_st = st.lists(st.tuples(resources_st, st.integers(1, 3)), min_size=1, max_size=14)


def with_mig(info, setup: str):
    if setup == "mixed":
        return info
    if setup == "disabled":
        return replace(info, gpus=tuple(replace(g, mig_mode=MigMode.DISABLED) for g in info.gpus))
    # MIG on where the GPU can: instances on every other GPU, none on the rest
    gpus = tuple(replace(g, mig_mode=MigMode.ENABLED, mig_instances=INSTANCES if g.index % 2 == 0 else ())
                 if g.mig_capable else replace(g, mig_mode=MigMode.DISABLED) for g in info.gpus)
    return replace(info, gpus=gpus, dynamic_mig=setup == "dynamic")
