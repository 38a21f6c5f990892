"""Random GPUs (``gpu_st``: MIG mode, instances, allocations, health) and requests
(``requests``: whole, share, MIG) for the fit-rule tests, and ``build``, the one-GPU
node state they describe."""
from __future__ import annotations

from dataclasses import replace

from hypothesis import strategies as st

from gpusched.core.mig import FULL_MASK, PROFILES
from gpusched.core.model import MigInstance, MigMode
from gpusched.core.state import ClusterState, NodeState, gpu_state

from .builders import make_node


INSTANCE_SETS = (
    (),
    (MigInstance("7g.80gb", 0, "MIG-7", slices=8),),
    (MigInstance("3g.40gb", 0, "MIG-a", slices=4), MigInstance("1g.10gb", 4, "MIG-b", slices=1),
     MigInstance("1g.20gb", 6, "MIG-c", slices=2)),
    (MigInstance("2g.20gb", 2, "MIG-d", slices=2), MigInstance("4g.40gb", 0, "MIG-e", slices=4)),
)
gpu_st = st.fixed_dictionaries({
    "mode": st.sampled_from(list(MigMode)), "instances": st.sampled_from(INSTANCE_SETS),
    "healthy": st.booleans(), "used_milli": st.sampled_from([0, 0, 300, 800, 1000]),
    "mig_mask": st.sampled_from([0, 0, 1, 0b110000, 0b11110000, FULL_MASK]),
    "used_memory": st.sampled_from([0, 0, 40_000, 80_000]),
})
requests = st.one_of(
    st.just(("whole", 0, 0)),
    st.tuples(st.just("share"), st.sampled_from([100, 250, 700]), st.sampled_from([0, 0, 10_000, 45_000])),
    st.tuples(st.just("mig"), st.sampled_from(sorted(PROFILES)), st.integers(0, 6)),
)


def build(gpus: list[dict], model: str, dynamic: bool) -> ClusterState:
    info = make_node("n1", gpus=len(gpus), model=model, cpu=64_000, mem=512_000)
    infos = tuple(replace(g, mig_mode=d["mode"], mig_instances=d["instances"] if d["mode"] is MigMode.ENABLED else ())
                  for g, d in zip(info.gpus, gpus))
    info = replace(info, gpus=infos, dynamic_mig=dynamic)
    states = []
    for g, d in zip(infos, gpus):
        s = gpu_state(g, dynamic)
        s.healthy = d["healthy"]
        # a GPU is shared or cut, never both (the reducer keeps it so)
        s.used_milli, s.mig_mask = (d["used_milli"], 0) if d["used_milli"] else (0, d["mig_mask"])
        s.used_memory_mib = d["used_memory"] if 0 < s.used_milli < 1000 else 0
        states.append(s)
    state = ClusterState()
    state.nodes["n1"] = NodeState(info=info, gpus=states)
    return state
