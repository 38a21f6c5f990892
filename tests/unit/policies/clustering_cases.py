"""The gpu-clustering baseline's cases (``GPU_CLUSTERING``): small clusters where its rule
decides (a node running only the job's shape, then a mixed node with it, then an idle
node, then the fuller node)."""
from __future__ import annotations

from tests.unit.core.builders import make_spec, share, whole
from tests.unit.policies.placement_cases import Case, node


GPU_CLUSTERING = [
    Case("node running only the same shape",
         [node("a"), node("b"), node("c")], make_spec(gpus=1), "c",
         busy=[("b", share(0, 300), 0), ("c", whole(0), 0)]),
    Case("a mixed node with the shape beats an idle one",
         [node("a"), node("b")], make_spec(milli=300), "b",
         busy=[("b", whole(0), 0), ("b", share(1, 400), 0)]),
    Case("an idle node beats one of other shapes",
         [node("b"), node("a")], make_spec(gpus=2), "a",
         busy=[("b", share(0, 300), 0)]),
    Case("same class: the fuller node",
         [node("a"), node("b")], make_spec(gpus=1), "b",
         busy=[("a", whole(0), 0), ("b", whole(0), 0), ("b", whole(1), 0)]),
]
