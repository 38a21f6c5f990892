"""fgd-lookahead (ours): FGD's score first; among choices it scores alike, the least
growth of expected final waste (``final_waste``); then a used node before an idle one;
then first fit."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from gpusched.policies.placement.fgd.fragmentation import final_waste
from tests.unit.policies import placement_reference as reference
from tests.unit.core.builders import make_spec, share, whole
from tests.unit.policies.placement_cases import Case, check, choose, cpu_job, node

ONE_GPU = [make_spec(gpus=1, cpu=8000, mem=0)] * 100
SHARES = ([make_spec(milli=810, cpu=1000, mem=0)] * 60 + [make_spec(milli=470, cpu=1000, mem=0)] * 30
          + [make_spec(milli=320, cpu=1000, mem=0)] * 10)

CASES = [
    # FGD scores both alike; on a the 320 leaves 210, which hardly any typical task fits
    # (expected to stay empty); on b it leaves 360, which the next 320 fills to 40.
    Case("a 320 joins a lone 320 rather than spoil a lone 470's pair",
         [node("a", gpus=1), node("b", gpus=1)], make_spec(milli=320, cpu=1000, mem=0), "b",
         busy=[("a", share(0, 470), 0), ("b", share(0, 320), 0)], typical=SHARES),
    # Inside one node too: the GPU whose hole the mix will fill.
    Case("the GPU whose leftover the mix will fill",
         [node("a", gpus=2)], make_spec(milli=320, cpu=1000, mem=0), "a", gpus=(1,),
         busy=[("a", share(0, 470), 0), ("a", share(1, 320), 0)], typical=SHARES),
    Case("fragmentation first: an idle node rather than stranding a used one's GPUs",
         [node("a"), node("b")], make_spec(gpus=1, cpu=4000, mem=0), "a",
         busy=[("b", (), 54_000)], typical=ONE_GPU),
    Case("alike for both: the used node, though the idle one came first",
         [node("a"), node("b")], make_spec(gpus=1, cpu=1000, mem=0), "b", gpus=(1,),
         busy=[("b", whole(0), 1000)], typical=ONE_GPU),
    Case("among used nodes: first fit",
         [node("a"), node("b"), node("c")], make_spec(gpus=1, cpu=1000, mem=0), "b",
         busy=[("b", whole(0), 1000), ("c", whole(0), 1000)], typical=ONE_GPU),
    Case("CPU-only job: as FGD",
         [node("a"), node("b")], cpu_job(4000), "b", busy=[("a", (), 54_000)], typical=ONE_GPU),
    Case("nothing fits",
         [node("a", gpus=2)], make_spec(gpus=4), None, typical=ONE_GPU),
]


@pytest.mark.parametrize("case", CASES, ids=str)
def test_fgd_lookahead(case: Case):
    check(case, "fgd-lookahead")


def test_fgd_alone_decides_otherwise():
    assert choose(CASES[0], "fgd")[0] == "a"        # spoils the 470's pair
    assert choose(CASES[1], "fgd") == ("a", (0,))
    assert choose(CASES[3], "fgd")[0] == "a"        # first registered, idle or not


@pytest.mark.parametrize("f, expected", [(0, 0), (100, 100), (300, 300)])
def test_final_waste_of_holes_no_typical_task_fits(f, expected):
    assert final_waste({(1000, 320, 1, ()): 0.5, (8000, 1000, 1, ()): 0.5})[f] == pytest.approx(expected)


def test_final_waste_ranks_holes_by_what_will_fill_them():
    waste = final_waste({(1000, 810, 1, ()): 0.6, (1000, 470, 1, ()): 0.3, (1000, 320, 1, ()): 0.1})
    assert waste[210] == pytest.approx(210)    # only rare small tasks: stays empty
    assert waste[530] < 200                    # a common 470 fills it to 60
    assert waste[360] < waste[210]             # a 320 fills it to 40
    assert all(waste[f] <= f + 1e-9 for f in range(1001))


# Typical mixes: shares of any size, whole-GPU and CPU-only shapes, any frequencies.
_SHAPES = st.one_of(st.builds(lambda m: (1000, m, 1, ()), st.integers(1, 999)),
                    st.builds(lambda n: (1000, 1000, n, ()), st.sampled_from((1, 2, 4, 8))),
                    st.just((1000, 0, 0, ())))


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(_SHAPES, st.floats(0.001, 1.0), min_size=1, max_size=20),
       st.floats(0.01, 2.0))
def test_final_waste_is_the_references_bit_for_bit(mix, patience):
    """The table's every bit as the reference computes it anew for each f: fgd-lookahead
    rounds its growth of waste, so a last-bit difference could change a decision."""
    total = sum(mix.values())
    mix = {shape: p / total for shape, p in mix.items()}
    assert final_waste(mix, patience).tobytes() == reference.final_waste(mix, patience).tobytes()
