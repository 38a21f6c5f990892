"""fgd: the least growth of fragmentation against the pool's typical tasks (the pending
and running jobs' shapes), scored as the reference simulator's integer, then first fit.

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
