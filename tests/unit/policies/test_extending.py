"""The worked examples of ``docs/design/extending.md``: a placement score, a queue order and a
preemption rule, each written the way the document says, and checked here."""
from __future__ import annotations

import dataclasses

from gpusched.core import events as ev
from gpusched.core.digest import digest
from gpusched.policies.memory import CycleMemory
from gpusched.policies.placement.gang import place_gang
from gpusched.policies.placement.heuristics import GPU_WEIGHT, ScoredPlacement
from gpusched.policies.placement.registry import make_placement
from gpusched.policies.statement import tentative
from gpusched.policies.preemption.search_context import SearchContext
from gpusched.policies.preemption.victim_rules import PreemptionConfig
from gpusched.policies.preemption.victim_search import VictimSearch
from tests.unit.core.builders import Log, make_node, make_spec
from tests.unit.policies.preemption_clusters import BE, HI, NOW, Cluster
from tests.unit.policies.preemption_configs import other_rules


# --- a placement score ---------------------------------------------------------------------
class WorstFit(ScoredPlacement):
    """The node left with the most free capacity (spreads load; the opposite of best-fit)."""

    name = "worst-fit"

    def score(self, state, statement, arrays, rows, job, res):
        free = arrays.cpu[rows] + GPU_WEIGHT * arrays.gpu[rows].sum(axis=1)
        return -free   # lower is better: the most free first


def test_worst_fit_spreads_where_best_fit_packs():
    log = Log(make_node("n1", gpus=4), make_node("n2", gpus=4))
    log.submit("running", make_spec(gpus=2, cpu=0, mem=0))
    first = place_one(log, "running", make_placement("best-fit"))
    assert log(ev.JobPlaced, job_id="running", attempt=0, workers=first).accepted
    log.submit("next", make_spec(gpus=1, cpu=0, mem=0))
    assert place_one(log, "next", make_placement("best-fit"))[0].node == first[0].node
    assert place_one(log, "next", WorstFit())[0].node != first[0].node


def test_the_score_also_ranks_a_gangs_nodes():
    """n1 has 2 of its 4 GPUs taken; a gang of two 1-GPU workers fits on either node alone
    (topology rates them alike): best-fit takes the tighter n1, WorstFit the emptier n2."""
    log = Log(make_node("n1", gpus=4), make_node("n2", gpus=4))
    log.submit("running", make_spec(gpus=2, cpu=0, mem=0))
    assert log(ev.JobPlaced, job_id="running", attempt=0,
               workers=place_one(log, "running", make_placement("best-fit"))).accepted
    log.submit("gang", make_spec(workers=2, gpus=1, cpu=0, mem=0))
    assert [w.node for w in place_one(log, "gang", make_placement("best-fit"))] == ["n1", "n1"]
    assert [w.node for w in place_one(log, "gang", WorstFit())] == ["n2", "n2"]


def place_one(log: Log, job_id: str, policy):
    with tentative(log.state) as statement:
        return place_gang(log.state, log.state.jobs[job_id], policy, statement)


# --- a queue order ---------------------------------------------------------------------------
def shortest_first_key(job) -> tuple[float, int]:
    """Jobs with a shorter time limit first (none: last), then submission order."""
    return (job.time_limit_s or float("inf"), job.seq)


def shortest_first(state, jobs, now, context=None):
    return sorted(jobs, key=shortest_first_key)


def test_shortest_first_orders_by_time_limit_then_submission():
    log = Log(make_node("n1", gpus=4))
    for job_id, limit in (("long", 7200.0), ("none", 0.0), ("short", 600.0), ("short2", 600.0)):
        spec = make_spec(name=job_id, gpus=1)
        log.submit(job_id, dataclasses.replace(spec, max_runtime_s=limit))
    order = shortest_first(log.state, [log.state.jobs[j] for j in log.state.pending], NOW)
    assert [j.job_id for j in order] == ["short", "short2", "long", "none"]


# --- a preemption rule -------------------------------------------------------------------------
def same_team_victims(state, job, now, config: PreemptionConfig = other_rules()):
    """Preemption's eligibility and cost, but a job may stop only its own team's jobs."""
    ctx = SearchContext(state, now, config, CycleMemory())
    with tentative(state) as scratch:
        search = VictimSearch(state, job, scratch,
                              lambda v: v.team == job.team and ctx.eligible(v, job, reclaim=False),
                              ctx.cost, ctx.set_key, config.max_victims)
        victims = search.run()
    return None if victims is None else tuple(v.job_id for v in victims)


def test_same_team_rule_stops_only_the_own_teams_job():
    c = Cluster(nodes=1, gpus=4)
    c.running("theirs", ("n1", (0, 1)), team="b", priority_class=BE, started=NOW - 900)
    c.running("ours", ("n1", (2, 3)), team="a", priority_class=BE, started=NOW - 5000)
    c.pending("urgent", gpus=2, team="a", priority_class=HI)
    before = digest(c.state)
    assert c.victims("urgent") == ("theirs",)   # the default rule: least work at risk
    assert same_team_victims(c.state, c.job("urgent"), NOW) == ("ours",)
    assert digest(c.state) == before
    c.pending("other", gpus=4, team="c", priority_class=HI)
    assert same_team_victims(c.state, c.job("other"), NOW) is None   # team c has nothing to stop
