"""The FGD paper's baselines: gpu-packing, gpu-clustering, dot-product and random, each
on small clusters where its rule decides (and differs from plain first fit)."""
from __future__ import annotations

from collections import Counter

import pytest

from gpusched.policies.statement import tentative
from gpusched.policies.placement.gang import place_gang
from gpusched.policies.placement.registry import make_placement
from tests.unit.core.builders import Log, make_spec, share, whole
from tests.unit.policies.placement_cases import Case, check, cpu_job, node
from tests.unit.policies.clustering_cases import GPU_CLUSTERING

GPU_PACKING = [
    Case("share goes on a used GPU, the fuller the better",
         [node("a"), node("b"), node("c")], make_spec(milli=200), "c", gpus=(1,),
         busy=[("b", share(0, 300), 0), ("c", whole(0), 0), ("c", share(1, 500), 0)]),
    Case("share on a used node's free GPU before an idle node",
         [node("a"), node("b")], make_spec(milli=600), "b", gpus=(1,),
         busy=[("b", share(0, 500), 0)]),
    Case("whole GPUs from a used node before an idle node",
         [node("a"), node("b")], make_spec(gpus=2), "b", gpus=(1, 2),
         busy=[("b", whole(0), 0)]),
    Case("between idle nodes the smaller one",
         [node("a", gpus=8), node("b", gpus=2)], make_spec(gpus=1), "b"),
    Case("CPU-only: first fit",
         [node("a"), node("b")], cpu_job(1000), "a", busy=[("b", whole(0), 0)]),
]


DOT_PRODUCT = [
    # dot(free, request): a has less free GPU, b less free CPU; the request is GPU-heavy.
    Case("least aligned with the request: the node short of what it asks most",
         [node("b"), node("a")], make_spec(gpus=1, cpu=1000), "a",
         busy=[("a", whole(0, 1, 2), 0), ("b", whole(0), 60_000)]),
    Case("CPU-heavy request: the node short of CPU",
         [node("a"), node("b")], make_spec(gpus=1, cpu=32_000), "b",
         busy=[("a", whole(0, 1), 0), ("b", whole(0), 30_000)]),
]


@pytest.mark.parametrize("case", GPU_PACKING, ids=str)
def test_gpu_packing(case: Case):
    check(case, "gpu-packing")


@pytest.mark.parametrize("case", GPU_CLUSTERING, ids=str)
def test_gpu_clustering(case: Case):
    check(case, "gpu-clustering")


@pytest.mark.parametrize("case", DOT_PRODUCT, ids=str)
def test_dot_product(case: Case):
    check(case, "dot-product")


def test_random_spreads_jobs_yet_is_a_function_of_the_state():
    def placements() -> list[str]:
        log = Log(*(node(f"n{i}", gpus=8) for i in range(8)))
        for i in range(40):
            assert log.submit(f"j{i}", make_spec(milli=100)).accepted
        out = []
        with tentative(log.state) as statement:
            for i in range(40):
                placed = place_gang(log.state, log.state.jobs[f"j{i}"], make_placement("random"), statement)
                out.append(placed[0].node)
        return out

    first = placements()
    assert first == placements()
    assert len(Counter(first)) >= 6            # 40 draws over 8 nodes
    assert max(Counter(first).values()) <= 12
