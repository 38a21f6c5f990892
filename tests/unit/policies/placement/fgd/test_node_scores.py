"""FGD's scores of single nodes in plain Python (``placement.fgd.node_scores``) against
numpy's (``fragmentation``), to the bit: sums, U of single rows, a share's terms."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.policies.placement.fgd.fragmentation import compile_mix, final_waste, usable
from gpusched.policies.placement.fgd.node_scores import RowScorer, pairwise


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0, 1e4, allow_nan=False), min_size=0, max_size=300))
def test_pairwise_sums_as_numpy_does(values):
    assert pairwise(values) == np.array(values, dtype=np.float64).sum()


@settings(max_examples=40, deadline=None)
@given(shares=st.lists(st.tuples(st.sampled_from([0, 2000, 8000, 16_000, 32_000]), st.integers(1, 1000),
                                 st.sampled_from([1, 1, 2, 4, 8]), st.floats(0.01, 1.0)), min_size=1, max_size=40),
       rows=st.lists(st.tuples(st.lists(st.sampled_from([0, 10, 90, 230, 470, 530, 770, 1000]), min_size=8, max_size=8),
                               st.integers(-1, 64_000)), min_size=1, max_size=20))
def test_row_scores_equal_numpy_to_the_bit(shares, rows):
    """U of single rows (``RowScorer``) is numpy's ``usable``, float for float, with
    mixes of many (milli, GPUs) combinations (numpy sums 8 or more pairwise), whether
    asked by the row's GPUs in their order or as a multiset (``row`` asks by the sorted
    GPUs: U and the tallies depend on the multiset only)."""
    mix: dict = {}
    for cpu, milli, gpus, p in shares:
        shape = (cpu, milli if gpus == 1 else 1000, gpus, ())
        mix[shape] = mix.get(shape, 0) + p
    total = sum(mix.values())
    mix = {s: p / total for s, p in mix.items()}
    compiled = compile_mix(mix, ["A100-80GB"])
    gpu = np.array([g for g, _ in rows], dtype=np.int64)
    cpu = np.array([c for _, c in rows], dtype=np.int64)
    expected = usable(compiled, gpu, cpu, np.zeros(len(rows), dtype=np.int64))
    scorer = RowScorer(compiled, lambda: final_waste(mix), lookahead=True)
    for i, (free, c) in enumerate(rows):
        assert scorer.usable_row(tuple(free), c, 0) == expected[i]
        assert scorer.row(tuple(free), c, 0, 0, False, (0,) * len(free)).u == expected[i]
        for m, cnt, room in zip(compiled.milli.tolist(), *scorer.tallies(free)):
            assert (cnt, room) == (sum(f >= m for f in free), sum(f for f in free if f >= m))


_FREE, _SHARE = [0, 10, 90, 110, 230, 470, 530, 770, 1000], [10, 110, 230, 460, 470, 999]
# What a share leaves on a GPU: combinations of exactly that many milli sit on a run's edge.
_SHARES_LEFT = sorted({f - s for f in _FREE for s in _SHARE if f > s})


@settings(max_examples=100, deadline=None)
@given(milli=st.lists(st.integers(1, 1000) | st.sampled_from(_SHARES_LEFT), min_size=0, max_size=20), whole=st.sets(st.sampled_from([1, 2, 4, 8])),
       free=st.lists(st.sampled_from(_FREE), min_size=1, max_size=8),
       share=st.sampled_from(_SHARE), level=st.integers(1, 4))
def test_share_terms_by_runs_equal_the_terms_one_by_one(milli, whole, free, share, level):
    """``RowScorer._share_terms`` computes the terms of U after a share in three runs of
    combinations (before and after, before only, neither); every term, for every free
    amount, is the float the term-by-term formula gives."""
    shapes = [(2000 * (i % 4), m, 1, ()) for i, m in enumerate(milli)] + [(0, 1000, n, ()) for n in sorted(whole)]
    mix = {shape: 1 / len(shapes) for shape in shapes} or {(0, 0, 0, ()): 1.0}
    compiled = compile_mix(mix, ["A100-80GB"])
    scorer = RowScorer(compiled, lambda: final_waste(mix), lookahead=False)
    cnt, room = scorer.tallies(tuple(free))
    weight = scorer.weight[0][min(level, len(scorer.levels))] if scorer.milli else ()   # level 0: no weight
    parts = tuple(zip(weight, cnt, room, scorer.count, scorer.milli))
    frees = [f for f in set(free) if f >= share]
    for f, terms in scorer._share_terms(parts, frees, share):
        g = f - share
        assert terms == [w * (r - (f if f >= m else 0) + (g if g >= m else 0))
                         if c - (f >= m) + (g >= m) >= need else 0.0 for w, c, r, need, m in parts]
