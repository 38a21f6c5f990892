"""MIG slices: valid layouts only, on GPUs already cut first (whole GPUs stay whole), at
the start that keeps the largest profile placeable. Every policy places MIG the same way."""
from __future__ import annotations

import pytest

from gpusched.policies.booking import tentative
from gpusched.policies.placement import PLACEMENTS, place_gang
from tests.unit.core.builders import make_spec, mig, whole
from tests.unit.policies.placement_cases import Case, build, check, node


def a100(name: str, gpus: int = 2):
    return node(name, gpus=gpus, model="A100-80GB")


CASES = [
    # GPU1 holds a 3g at slices 0-3: a 1g at slice 6 leaves 4-5 for a 2g (at 4 or 5: only 1g).
    Case("1g on the cut GPU, where a 2g still fits after",
         [a100("a")], make_spec(mig="1g"), "a", gpus=(1,), busy=[("a", mig(1, "3g", 0), 0)]),
    Case("3g next to the other 3g, not on the whole GPU",
         [a100("a")], make_spec(mig="3g"), "a", gpus=(1,), busy=[("a", mig(1, "3g", 0), 0)]),
    Case("the node with a cut GPU before an untouched one",
         [a100("b"), a100("a")], make_spec(mig="2g"), "a", busy=[("a", mig(0, "1g", 0), 0)]),
    Case("7g needs a GPU with nothing on it",
         [a100("a")], make_spec(mig="7g"), None, busy=[("a", whole(0), 0), ("a", mig(1, "1g", 0), 0)]),
    Case("no MIG on a model without it",
         [node("a", model="L40S-48GB")], make_spec(mig="1g"), None),
]


@pytest.mark.parametrize("policy", sorted(PLACEMENTS))
@pytest.mark.parametrize("case", CASES, ids=str)
def test_mig(case: Case, policy: str):
    check(case, policy)


def test_mig_start_keeps_the_largest_profile():
    state = build(CASES[0]).state
    with tentative(state) as booking:
        placed = place_gang(state, state.jobs["job"], PLACEMENTS["best-fit"], booking)
    assert placed[0].gpus[0].mig_start == 6
