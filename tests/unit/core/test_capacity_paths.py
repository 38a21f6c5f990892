"""check_placement's single-worker path gives the same answer, reason included, as the
general distinct-nodes path it shortcuts, whatever the node and the proposed slots."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.core import capacity
from gpusched.core.mig import FULL_MASK
from gpusched.core.model import GpuSlot, NodeStatus, WorkerAssignment
from gpusched.core.state import ClusterState, GpuState, NodeState

from .builders import make_node, make_spec

slots = st.lists(st.builds(GpuSlot, index=st.integers(-1, 4), milli=st.sampled_from([1000, 500, 250, 1]),
                           mig_profile=st.sampled_from(["", "", "1g", "3g", "7g"]), mig_start=st.integers(0, 6)),
                 max_size=3).map(tuple)
specs = st.one_of(
    st.builds(lambda n, cpu: make_spec(gpus=n, cpu=cpu), st.integers(1, 3), st.sampled_from([1000, 20_000])),
    st.builds(lambda m: make_spec(milli=m), st.sampled_from([250, 500, 1000])),
    st.builds(lambda p: make_spec(mig=p), st.sampled_from(["1g", "3g", "7g"])),
    st.builds(lambda m: make_spec(gpus=1, models=(m,)), st.sampled_from(["A100-80GB", "L40S-48GB"])),
)
gpu_states = st.tuples(st.sampled_from([0, 0, 500, 1000]), st.booleans(), st.integers(0, FULL_MASK))


def matching(spec):
    """Slots of the kind the spec asks for, on random GPUs: most get past the shape checks."""
    res = spec.resources
    index = st.integers(0, 2)
    if res.mig_profile:
        from gpusched.core.mig import PROFILES
        p = PROFILES[res.mig_profile]
        return st.tuples(st.builds(GpuSlot, index=index, milli=st.just(p.milli), mig_profile=st.just(res.mig_profile),
                                   mig_start=st.sampled_from(p.starts)))
    if res.is_share:
        return st.tuples(st.builds(GpuSlot, index=index, milli=st.just(res.gpu_milli)))
    return st.lists(index, min_size=res.gpus, max_size=res.gpus, unique=True).map(
        lambda ix: tuple(GpuSlot(i) for i in ix))


@settings(max_examples=600, deadline=None)
@given(data=st.data(), spec=specs, gpus=st.lists(gpu_states, min_size=3, max_size=3),
       model=st.sampled_from(["A100-80GB", "L40S-48GB"]), status=st.sampled_from([NodeStatus.READY, NodeStatus.READY, NodeStatus.LOST]),
       pool=st.sampled_from(["default", "default", "other"]), used_cpu=st.sampled_from([0, 15_000]),
       node_name=st.sampled_from(["n1", "n1", "missing"]))
def test_single_worker_path_matches_the_general_one(data, spec, gpus, model, status, pool, used_cpu, node_name):
    proposed = data.draw(st.one_of(slots, matching(spec), matching(spec)))
    info = make_node("n1", gpus=len(gpus), model=model, pool=pool)
    state = ClusterState()
    state.nodes["n1"] = NodeState(info=info, status=status, used_cpu=used_cpu, gpus=[
        GpuState(g, healthy=healthy, used_milli=used, mig_mask=0 if used else mask)
        for g, (used, healthy, mask) in zip(info.gpus, gpus)])
    worker = WorkerAssignment(0, node_name, proposed)
    assert capacity._check_one(state, spec, worker) == capacity._check_on_distinct_nodes(state, spec, (worker,))
