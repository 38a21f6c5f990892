"""MIG slices: valid layouts only, on GPUs already cut first (whole GPUs stay whole), at
the start that keeps the largest profile placeable. Every policy places MIG the same way."""
from __future__ import annotations

import pytest

from gpusched.policies.statement import tentative
from gpusched.policies.placement.gang import place_gang
from gpusched.policies.placement.registry import PLACEMENTS, make_placement
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
    with tentative(state) as statement:
        placed = place_gang(state, state.jobs["job"], make_placement("best-fit"), statement)
    assert placed[0].gpus[0].mig_start == 6


# --- the fast paths agree with the plain definitions ------------------------------------
from hypothesis import given, settings, strategies as st  # noqa: E402

from gpusched.core.mig import FULL_MASK, PROFILES, _largest_placeable, largest_placeable  # noqa: E402
from gpusched.core.model import GpuSlot  # noqa: E402
from gpusched.core.state import GpuState, NodeState  # noqa: E402
from gpusched.policies.gpu_fit import pick_mig  # noqa: E402
from tests.unit.core.builders import make_node  # noqa: E402


def test_largest_placeable_table_matches_the_profiles():
    for mask in range(FULL_MASK + 1):
        assert largest_placeable(mask) == _largest_placeable(mask), bin(mask)
    assert largest_placeable(0) == 7 and largest_placeable(FULL_MASK) == 0
    assert largest_placeable(0b1) == 3     # slice 0 taken: a 4g (start 0 only) is gone, a 3g at 4 fits


def _pick_mig_reference(node: NodeState, profile_name: str):
    """pick_mig as first written: every GPU, every start, no shortcuts."""
    profile = PROFILES[profile_name]
    best = None
    for g in node.gpus:
        for start in profile.starts:
            if g.fits_mig(profile, start):
                left = _largest_placeable(g.mig_mask | profile.mask(start))
                key = (g.mig_mask == 0, -left, g.info.index, start)
                if best is None or key < best[0]:
                    best = (key, GpuSlot(g.info.index, profile.milli, profile_name, start))
    return (best[1],) if best else None


gpu_states = st.tuples(st.sampled_from([0, 0, 250, 1000]), st.booleans(), st.integers(0, FULL_MASK))


@settings(max_examples=300, deadline=None)
@given(gpus=st.lists(gpu_states, min_size=1, max_size=8), profile=st.sampled_from(sorted(PROFILES)),
       model=st.sampled_from(["A100-80GB", "H100-80GB", "L40S-48GB"]))
def test_pick_mig_matches_the_reference(gpus, profile, model):
    info = make_node("n", gpus=len(gpus), model=model)
    node = NodeState(info=info, gpus=[
        GpuState(g, healthy=healthy, used_milli=used, mig_mask=0 if used else mask)
        for g, (used, healthy, mask) in zip(info.gpus, gpus)])
    assert pick_mig(node, make_spec(mig=profile).resources) == _pick_mig_reference(node, profile)
