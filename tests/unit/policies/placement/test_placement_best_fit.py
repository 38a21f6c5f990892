"""best-fit (the default): the node left with the least free CPU + 16 x free GPU milli,
found through the free-capacity index; ties by registration order."""
from __future__ import annotations

import pytest

from tests.unit.core.builders import make_spec, share, whole
from tests.unit.policies.placement_cases import Case, check, cpu_job, node

CASES = [
    Case("whole GPU goes to the fuller node",
         [node("a"), node("b")], make_spec(gpus=1), "b", gpus=(3,),
         busy=[("b", whole(0, 1, 2), 1000)]),
    Case("free CPU counts: fewer idle cores wins between equal GPUs",
         [node("a"), node("b")], make_spec(gpus=1), "a",
         busy=[("a", whole(0), 40_000), ("b", whole(0), 1000)]),
    Case("a GPU weighs 16 cores: one GPU less beats 15 cores less",
         [node("a"), node("b")], make_spec(gpus=1), "b",
         busy=[("a", whole(0), 15_000), ("b", whole(0, 1), 0)]),
    Case("share goes to the node with the partly used GPU",
         [node("a"), node("b")], make_spec(milli=300), "b", gpus=(0,),
         busy=[("b", share(0, 600), 0)]),
    Case("inside the node, the tightest GPU that fits",
         [node("a", gpus=3)], make_spec(milli=300), "a", gpus=(2,),
         busy=[("a", share(0, 800), 0), ("a", share(1, 500), 0), ("a", share(2, 650), 0)]),
    Case("a share too big for every partly used GPU takes a whole one",
         [node("a", gpus=2)], make_spec(milli=700), "a", gpus=(1,),
         busy=[("a", share(0, 400), 0)]),
    Case("whole GPUs need fully free GPUs: shared ones do not count",
         [node("a", gpus=2), node("b", gpus=4)], make_spec(gpus=2), "b", gpus=(0, 1),
         busy=[("a", share(0, 100), 0)]),
    Case("model constraint beats tightness",
         [node("a", model="A100-80GB"), node("b")], make_spec(gpus=1, models=("A100-80GB",)), "a",
         busy=[("b", whole(0, 1, 2), 0)]),
    Case("not enough CPU on the tight node",
         [node("a", cpu=8000), node("b")], make_spec(gpus=1, cpu=6000), "b",
         busy=[("a", whole(0, 1, 2), 4000)]),
    Case("not enough memory on the tight node",
         [node("a", mem=10_000), node("b")], make_spec(gpus=1, mem=20_000), "b",
         busy=[("a", whole(0, 1, 2), 0)]),
    Case("cordoned node is skipped",
         [node("a"), node("b")], make_spec(gpus=1), "a",
         busy=[("b", whole(0, 1, 2), 0)], cordoned=("b",)),
    Case("unhealthy GPU is not taken",
         [node("a", gpus=2)], make_spec(gpus=1), "a", gpus=(1,), unhealthy=(("a", 0),)),
    Case("ties go to the node registered first",
         [node("b"), node("a")], make_spec(gpus=1), "b", gpus=(0,)),
    Case("CPU-only job goes where GPUs are already taken",
         [node("a"), node("b")], cpu_job(4000), "b",
         busy=[("b", whole(0, 1, 2, 3), 8000)]),
    Case("nothing fits anywhere",
         [node("a", gpus=2), node("b", gpus=2)], make_spec(gpus=3), None),
]


@pytest.mark.parametrize("case", CASES, ids=str)
def test_best_fit(case: Case):
    check(case, "best-fit")
