"""The worked examples of ``docs/design/extending.md``: a placement score, a queue order, a
preemption rule, a consumer of the pool log and a job's own reaction to an exit code, each
written the way the document says, and checked here."""
from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from types import SimpleNamespace

from gpusched.adapters.log import codec
from gpusched.adapters.log.fold import fold_records
from gpusched.adapters.log.publisher import DeadLetters
from gpusched.core import events as ev
from gpusched.core.digest import digest
from gpusched.core.model import FailureCause, JobPhase, RetryAction, RetryRule
from gpusched.core.state import ClusterState
from gpusched.policies.memory import CycleMemory
from gpusched.policies.placement.gang import place_gang
from gpusched.policies.placement.heuristics import GPU_WEIGHT, ScoredPlacement
from gpusched.policies.placement.registry import make_placement
from gpusched.policies.statement import tentative
from gpusched.policies.preemption.search_context import SearchContext
from gpusched.policies.preemption.victim_rules import PreemptionConfig
from gpusched.policies.preemption.victim_search import VictimSearch
from tests.unit.core.builders import Log, make_node, make_spec, whole
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


# --- a Kafka consumer --------------------------------------------------------------------------
class PlacementsPerTeam:
    """Placements the pool log accepted, per team: the ``on_event`` of a ``LogFollower``."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def __call__(self, partition, offset, event, outcome, state) -> None:
        if isinstance(event, ev.JobPlaced) and outcome.accepted:
            self.counts[state.jobs[event.job_id].team] += 1


def test_a_consumer_counts_the_placements_the_log_accepted():
    log = Log(make_node("n1", gpus=2))
    log.submit("a1", make_spec("team-a", gpus=1, cpu=0, mem=0))
    log.submit("a2", make_spec("team-a", gpus=1, cpu=0, mem=0))
    log.submit("b1", make_spec("team-b", gpus=1, cpu=0, mem=0))
    assert log.place("a1", ("n1", whole(0))).accepted
    assert log.place("a2", ("n1", whole(1))).accepted
    assert not log.place("b1", ("n1", whole(1))).accepted     # a GPU already taken: refused, not counted
    # the records as the follower's consumer fetches them, folded by the follower's own loop
    records = [SimpleNamespace(topic="events", partition=0, offset=offset, value=codec.encode(event, "default"))
               for offset, event in enumerate(log.events)]
    counts = PlacementsPerTeam()
    folded = ClusterState()
    asyncio.run(fold_records("placements", folded, records, counts, DeadLetters(None, "placements")))
    assert counts.counts == Counter({"team-a": 2})
    assert digest(folded) == digest(log.state)


# --- a reaction to a worker's exit -------------------------------------------------------------
def test_a_job_asks_that_exit_75_place_it_again_uncounted():
    log = Log(make_node("n1", gpus=1))
    spec = dataclasses.replace(make_spec(gpus=1, max_restarts=0),
                               retry=(RetryRule(FailureCause.EXIT, (75,), RetryAction.IGNORE),))
    assert log.submit("j", spec).accepted
    log.run("j", ("n1", whole(0)))
    assert log.finish("j", 0, 75).accepted
    job = log.job("j")
    assert job.phase is JobPhase.PENDING and job.restarts == 0
    assert [(f.cause, f.exit_code, f.counted) for f in job.failures] == [(FailureCause.EXIT, 75, False)]
    log.job("j").not_before = 0.0
    log.run("j", ("n1", whole(0)))
    assert log.finish("j", 0, 1).accepted                    # any other code: its max_restarts (0) decides
    assert log.job("j").phase is JobPhase.FAILED
