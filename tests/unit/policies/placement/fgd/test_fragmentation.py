"""FGD's rule (``placement.fgd.fragmentation``): ``usable``, over numpy arrays, against
the definition of a node's fragmentation written out one node at a time; fgd-lookahead's
``final_waste``, by hand and against the reference's."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.policies.placement.fgd.fragmentation import compile_mix, final_waste, usable
from tests.unit.policies import placement_reference as reference


def fragmentation(mix: dict, gpus: list[int], cpu: int, model: str) -> float:
    """Free GPU milli the typical shapes cannot use, by FGD's definition, one node."""
    total, frag = sum(gpus), 0.0
    for (cpu_t, milli, count, models), p in mix.items():
        fits = (not models or model in models) and cpu >= cpu_t and count and \
            sum(g >= milli for g in gpus) >= count
        frag += p * (sum(g for g in gpus if g < milli) if fits else total)
    return frag


shapes = st.tuples(st.sampled_from([0, 2000, 8000, 16_000]), st.sampled_from([0, 100, 250, 500, 800, 1000]),
                   st.sampled_from([0, 1, 2, 4]), st.sampled_from([(), ("H100-80GB",), ("A10-24GB",)]))


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(shapes, st.floats(0.01, 1.0), min_size=1, max_size=6),
       st.lists(st.lists(st.sampled_from([0, 50, 200, 499, 500, 700, 1000]), min_size=8, max_size=8),
                min_size=1, max_size=5),
       st.lists(st.integers(0, 20_000), min_size=5, max_size=5),
       st.lists(st.sampled_from(["H100-80GB", "A10-24GB"]), min_size=5, max_size=5))
def test_usable_matches_the_definition_of_fragmentation(raw, gpus, cpus, models):
    # Shapes are made consistent the way shape_of makes them: no GPUs -> milli 0, etc.
    mix = {}
    for (cpu, milli, count, allowed), p in raw.items():
        shape = (cpu, 0, 0, allowed) if not count or not milli else \
            (cpu, milli if count == 1 else 1000, count, allowed)
        mix[shape] = mix.get(shape, 0) + p
    total = sum(mix.values())
    mix = {s: p / total for s, p in mix.items()}
    names = ["A10-24GB", "H100-80GB"]
    compiled = compile_mix(mix, names)
    rows = len(gpus)
    u = usable(compiled, np.array(gpus), np.array(cpus[:rows]), np.array([names.index(m) for m in models[:rows]]))
    for i in range(rows):
        expected = fragmentation(mix, gpus[i], cpus[i], models[i])
        assert sum(gpus[i]) - u[i] == pytest.approx(expected, abs=1e-6)


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
