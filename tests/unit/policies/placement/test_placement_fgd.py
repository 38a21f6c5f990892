"""fgd: the least growth of fragmentation against the pool's typical tasks (the pending
and running jobs' shapes), scored as the reference simulator's integer, then first fit.

Each case submits 100 pending ``typical`` jobs of one shape, so that shape alone is the
mix (over the 95 % popularity cut); the numbers in the comments are the growth of
fragmentation (milli) on each candidate."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.core.model import JobSpec, WorkerResources
from gpusched.policies.placement.fragmentation import NONE, Fgd, compile_mix, usable
from gpusched.policies.placement.registry import PLACEMENTS
from gpusched.policies.statement import Statement
from tests.unit.core.builders import Log
from tests.unit.policies.placement_cases import Case, check, choose, node
from tests.unit.policies.fgd_cases import mix, CASES


@pytest.mark.parametrize("case", CASES, ids=str)
def test_fgd(case: Case):
    check(case, "fgd")


def test_fgd_and_best_fit_disagree_where_fragmentation_matters():
    assert choose(CASES[0], "best-fit")[0] == "b"
    assert choose(CASES[1], "best-fit") == ("a", (0,))
    assert choose(CASES[3], "best-fit")[0] == "b"
    assert choose(CASES[4], "best-fit")[0] == "a"


# --- the vectorised fragmentation against its definition --------------------------------
@pytest.mark.parametrize("policy", ["fgd", "fgd-lookahead"])
def test_nodes_of_a_model_the_request_refuses_get_no_candidate(monkeypatch, policy):
    """The first scoring of a request (one node per group of equal nodes) keeps no key on
    the nodes of a GPU model it does not accept. Were they given one, the H100s would win
    here (the T4-only mix cannot use them: taking one is free), ``take`` would refuse
    them and ``scan`` rank every candidate again: the same decision, much slower."""
    log = Log(*(node(f"{m[0].lower()}{i}", model=m) for i in range(2) for m in ("H100-80GB", "T4-16GB")))
    res = WorkerResources(gpus=1, cpu_milli=1000, memory_mib=1000, gpu_models=("T4-16GB",))
    assert log.submit("j", JobSpec(name="j", team="t", resources=res)).accepted

    def scan(*_):
        raise AssertionError("the first candidate was refused: scan ran")
    monkeypatch.setattr(Fgd, "scan", scan)
    placement, statement = PLACEMENTS[policy](), Statement(log.state)
    chosen, _ = placement.choose(log.state, statement, log.job("j"), res)
    assert chosen.name == "t0"
    view = placement.view(log.state, statement, "default")
    (best,) = view.best.values()
    names = view.arrays.nodes
    assert sorted(names[i].name for i in np.flatnonzero(best.key != NONE)) == ["t0", "t1"]
    assert sorted(names[i].name for i in best.fits) == ["t0", "t1"]
    statement.close()


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
