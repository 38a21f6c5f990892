"""fgd: the least growth of fragmentation against the pool's typical tasks (the pending
and running jobs' shapes), scored as the reference simulator's integer, then first fit;
fgd-lookahead (ours): FGD's score first; among choices it scores alike, the least
growth of expected final waste (``final_waste``); then a used node before an idle one;
then first fit.

Each case submits 100 pending ``typical`` jobs of one shape, so that shape alone is the
mix (over the 95 % popularity cut); the numbers in the comments are the growth of
fragmentation (milli) on each candidate."""
from __future__ import annotations

import numpy as np
import pytest

from gpusched.core.model import JobSpec, WorkerResources
from gpusched.policies.placement.fgd.policy import Fgd
from gpusched.policies.placement.fgd.pool_scores import NONE
from gpusched.policies.placement.registry import PLACEMENTS
from gpusched.policies.statement import Statement
from tests.unit.core.builders import Log, make_spec, share, whole
from tests.unit.policies.placement_cases import Case, check, choose, cpu_job, node
from tests.unit.policies.fgd_cases import mix, CASES


@pytest.mark.parametrize("case", CASES, ids=str)
def test_fgd(case: Case):
    check(case, "fgd")


def test_fgd_and_best_fit_disagree_where_fragmentation_matters():
    assert choose(CASES[0], "best-fit")[0] == "b"
    assert choose(CASES[1], "best-fit") == ("a", (0,))
    assert choose(CASES[3], "best-fit")[0] == "b"
    assert choose(CASES[4], "best-fit")[0] == "a"


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


# --- fgd-lookahead ---------------------------------------------------------------------
ONE_GPU = [make_spec(gpus=1, cpu=8000, mem=0)] * 100
SHARES = ([make_spec(milli=810, cpu=1000, mem=0)] * 60 + [make_spec(milli=470, cpu=1000, mem=0)] * 30
          + [make_spec(milli=320, cpu=1000, mem=0)] * 10)

LOOKAHEAD_CASES = [
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


@pytest.mark.parametrize("case", LOOKAHEAD_CASES, ids=str)
def test_fgd_lookahead(case: Case):
    check(case, "fgd-lookahead")


def test_fgd_alone_decides_otherwise():
    assert choose(LOOKAHEAD_CASES[0], "fgd")[0] == "a"        # spoils the 470's pair
    assert choose(LOOKAHEAD_CASES[1], "fgd") == ("a", (0,))
    assert choose(LOOKAHEAD_CASES[3], "fgd")[0] == "a"        # first registered, idle or not
