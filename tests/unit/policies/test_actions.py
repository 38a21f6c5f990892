"""The preemptor's actions (gpusched.policies.actions): a registry of named actions run in
a configured order, each one able to stop the call when it proposed something."""
from __future__ import annotations

import argparse
import re
from dataclasses import replace

import pytest

from gpusched.config import PreemptorSettings
from gpusched.core import events as ev
from gpusched.core.model import JobPhase
from gpusched.policies.actions import (
    ACTIONS, DEFAULT_ACTIONS, Action, AttemptVerdict, NodeVerdict, Proposal, Situation, make_actions, run_actions,
)
from gpusched.policies.memory import CycleMemory
from gpusched.policies.preemption.decisions import preemption_decisions, preemption_events
from gpusched.policies.preemption.defrag import defrag_decisions
from gpusched.policies.preemption.victim_rules import PreemptionConfig
from gpusched.policies.supervision import (
    SupervisionConfig, hung_attempts, lost_nodes, nodes_to_fence, timed_out_attempts,
)
from gpusched_preemptor.decide import PreemptorDecider
from tests.unit.core.builders import make_spec, whole
from tests.unit.policies.defrag_clusters import BE, NOW, Cluster
from tests.unit.policies.preemption_configs import other_rules

SUPERVISION = SupervisionConfig(heartbeat_timeout_s=10.0)
ALL_HEARD = {"n1": NOW, "n2": NOW, "n3": NOW}


def both_ways() -> Cluster:
    """A pending job that priority preemption and defragmentation would each serve, with
    different victims: preemption may stop only ``a`` (lower priority, not checkpointable),
    defragmentation may move only ``b`` (checkpointable, same priority)."""
    c = Cluster()
    c.running("a", "n1", (0, 1, 2, 3), priority_class=BE, ckpt_every=0.0, ckpt=None)
    c.running("b", "n2", (0, 1, 2, 3))
    c.running("full", "n3", tuple(range(8)), preemptible=False)
    c.pending("big", gpus=8)
    return c


def timed_out(c: Cluster, job_id: str, node: str, gpus: tuple[int, ...]) -> None:
    """A running job whose time limit of 60 s passed long ago."""
    spec = replace(make_spec(name=job_id, gpus=len(gpus), cpu=0, mem=0), max_runtime_s=60.0)
    assert c.log(ev.JobSubmitted, job_id=job_id, spec=spec, time=NOW - 1000).accepted
    assert c.log(ev.JobPlaced, job_id=job_id, attempt=0, time=NOW - 1000,
                 workers=(ev.WorkerAssignment(0, node, whole(*gpus)),)).accepted
    assert c.log(ev.WorkerStarted, job_id=job_id, attempt=0, worker=0, node=node, time=NOW - 1000).accepted


def decide(c: Cluster, names=DEFAULT_ACTIONS, heard=ALL_HEARD) -> list[ev.Event]:
    decider = PreemptorDecider("p", other_rules(), SUPERVISION, lambda now: (heard, 0.0, True),
                               make_actions(names))
    return [e for e, _ in decider(0, c.state, NOW)]


def before(c: Cluster, heard=ALL_HEARD) -> list[ev.Event]:
    """What the preemptor decided before its actions were configurable, written out: lost
    nodes and fences (and nothing else when there are any), then timeouts, hung attempts,
    and preemption, with defragmentation only when preemption found nothing."""
    state, config, out = c.state, other_rules(), []
    out += [ev.NodeLost(event_id="", node=n, reason=r) for n, r in lost_nodes(state, heard, 0.0, NOW, SUPERVISION)]
    out += [ev.NodeFenced(event_id="", node=n) for n in nodes_to_fence(state, NOW)]
    if out:
        return out
    out += [ev.AttemptTimedOut(event_id="", job_id=j, attempt=a, reason=r) for j, a, r in timed_out_attempts(state, NOW)]
    out += [ev.AttemptFailed(event_id="", job_id=j, attempt=a, reason=r)
            for j, a, r in hung_attempts(state, NOW, SUPERVISION)]
    plans = preemption_decisions(state, NOW, CycleMemory(), config) or defrag_decisions(state, NOW, CycleMemory(), config)
    return out + [e for plan in plans for e in preemption_events(state, plan, NOW, "p")]


def same(events: list[ev.Event]) -> list[ev.Event]:
    """Events without what each call draws anew (supervision events get random ids)."""
    return [replace(e, event_id="" if not e.event_id.startswith("preempt:") else e.event_id,
                    time=NOW, producer="p") for e in events]


# --- the default order decides as before -------------------------------------------------
@pytest.mark.parametrize("scenario", ["preempt and defrag", "defrag only", "a silent node", "timeouts",
                                      "nothing"])
def test_the_default_order_decides_exactly_as_before(scenario):
    heard = ALL_HEARD
    if scenario == "defrag only":
        c = Cluster()
        c.running("a", "n1", (0, 1, 2, 3))
        c.running("b", "n2", (0, 1, 2, 3), ckpt=NOW - 120)
        c.running("full", "n3", tuple(range(8)), preemptible=False)
        c.pending("big", gpus=8)
    elif scenario == "nothing":
        c = Cluster()
        c.running("a", "n1", (0, 1, 2, 3))
    else:
        c = both_ways()
        if scenario in ("a silent node", "timeouts"):
            timed_out(c, "late", "n2", (4,))
        if scenario == "a silent node":
            heard = {**ALL_HEARD, "n2": NOW - 60}
    expected = same(before(c, heard))
    assert same(decide(c, heard=heard)) == expected
    kinds = {"preempt and defrag": {ev.JobPreempted}, "defrag only": {ev.JobPreempted},
             "a silent node": {ev.NodeLost}, "timeouts": {ev.AttemptTimedOut, ev.JobPreempted}, "nothing": set()}
    assert {type(e) for e in expected} == kinds[scenario]   # each scenario shows what it means to


# --- another order decides otherwise -------------------------------------------------------
def test_defrag_before_preempt_moves_jobs_instead_of_stopping_lower_priority_ones():
    c = both_ways()
    first = decide(c)
    assert [(e.job_id, e.reason) for e in first] == [("a", "priority: preempted for big")]
    moved = decide(c, ("nodes", "attempts", "defrag", "preempt"))
    assert [(e.job_id, e.reason) for e in moved] == [("b", "defragmentation: preempted for big")]


def test_without_defrag_a_fragmented_pool_waits():
    c = Cluster()
    c.running("a", "n1", (0, 1, 2, 3))
    c.running("b", "n2", (0, 1, 2, 3))
    c.running("full", "n3", tuple(range(8)), preemptible=False)
    c.pending("big", gpus=8)
    assert [e.job_id for e in decide(c)] == ["a"]
    assert decide(c, ("nodes", "attempts", "preempt")) == []


def test_a_stopping_action_ends_the_call_only_when_it_proposed():
    c = both_ways()
    timed_out(c, "late", "n2", (4,))
    silent = {**ALL_HEARD, "n2": NOW - 60}
    assert [type(e) for e in decide(c, heard=silent)] == [ev.NodeLost]           # nodes stops
    after = decide(c, ("attempts", "nodes", "preempt"), heard=silent)            # attempts does not
    assert [type(e) for e in after] == [ev.AttemptTimedOut, ev.NodeLost]
    assert [type(e) for e in decide(c, ("nodes", "attempts", "preempt"))] == [ev.AttemptTimedOut, ev.JobPreempted]


def test_run_actions_stops_after_the_first_stopping_action_that_proposed():
    calls = []

    def action(name, stops, proposes):
        def decide_(s):
            calls.append(name)
            return [NodeVerdict(name)] if proposes else []
        return replace(ACTIONS["nodes"], name=name, decide=decide_, stops=stops)

    s = Situation(Cluster().state, NOW, SUPERVISION, lambda state: other_rules(), CycleMemory())
    chain = [action("quiet", True, False), action("loud", False, True), action("stopper", True, True),
             action("never", False, True)]
    assert [p.node for p in run_actions(chain, s)] == ["loud", "stopper"]
    assert calls == ["quiet", "loud", "stopper"]


def test_the_preemption_settings_are_computed_only_when_an_action_asks():
    asked = []
    s = Situation(Cluster().state, NOW, SUPERVISION, lambda state: asked.append(state) or other_rules(), CycleMemory())
    run_actions(make_actions(("nodes", "attempts")), s)
    assert asked == []
    run_actions(make_actions(("preempt", "defrag")), s)
    assert len(asked) == 1


def test_attempt_verdicts_say_which_end():
    c = Cluster()
    timed_out(c, "late", "n1", (0,))
    (verdict,) = ACTIONS["attempts"].decide(Situation(c.state, NOW, SUPERVISION, lambda s: other_rules(), CycleMemory()))
    assert verdict == AttemptVerdict("late", 0, "time limit of 60s reached", timed_out=True)


# --- the worked example of docs/design/extending.md ("A preemptor action") ---------------------------
def stuck_placements(s: Situation) -> list[Proposal]:
    """Attempts placed more than 300 s ago that never started: failed, to be placed again."""
    return [AttemptVerdict(job.job_id, job.attempt, f"not started {s.now - job.placed_at:.0f}s after placement",
                           timed_out=False)
            for job in s.state.jobs.values()
            if job.phase is JobPhase.PLACED and s.now - job.placed_at > 300.0]


def test_a_new_action_runs_where_the_order_names_it(monkeypatch):
    monkeypatch.setitem(ACTIONS, "stuck", Action("stuck", stuck_placements, stops=False, help="never started"))
    c = Cluster()
    assert c.log(ev.JobSubmitted, job_id="s", spec=make_spec(name="s", gpus=1, cpu=0, mem=0), time=NOW - 999).accepted
    assert c.log(ev.JobPlaced, job_id="s", attempt=0, time=NOW - 900,
                 workers=(ev.WorkerAssignment(0, "n1", whole(0)),)).accepted
    assert decide(c) == []
    (failed,) = decide(c, ("nodes", "attempts", "stuck", "preempt", "defrag"))
    assert isinstance(failed, ev.AttemptFailed) and failed.job_id == "s"
    assert failed.reason == "not started 900s after placement"
    assert c.log.replay(failed).accepted and c.state.jobs["s"].phase is JobPhase.STOPPING   # then placed again


# --- configuration -------------------------------------------------------------------------
@pytest.mark.parametrize("names, message", [
    (("nodes", "bogus", "preempt", "other"), "unknown action 'bogus', 'other' (known: nodes, attempts, autoscale, preempt, defrag)"),
    (("preempt", "defrag", "preempt"), "action 'preempt' named more than once"),
    ((), "no action named"),
])
def test_bad_action_lists_are_refused_naming_what_is_wrong(names, message):
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        make_actions(names)


def test_the_settings_default_is_the_registry_default():
    assert PreemptorSettings().action_names == DEFAULT_ACTIONS
    assert set(DEFAULT_ACTIONS) == set(ACTIONS)


def _settings(argv: list[str], env: dict[str, str]) -> PreemptorSettings:
    parser = argparse.ArgumentParser()
    PreemptorSettings.add_args(parser, env)
    return PreemptorSettings.from_args(parser.parse_args(argv), env)


def test_the_order_comes_from_the_flag_or_the_variable():
    assert _settings([], {"GPUSCHED_PREEMPTOR_ACTIONS": "defrag, preempt"}).action_names == ("defrag", "preempt")
    assert _settings(["--actions", "nodes,preempt"], {"GPUSCHED_PREEMPTOR_ACTIONS": "defrag"}).action_names == \
        ("nodes", "preempt")


def test_the_preemptor_stops_at_start_on_a_bad_action_naming_flag_and_variable(monkeypatch):
    from gpusched_preemptor.main import main
    monkeypatch.setenv("GPUSCHED_PREEMPTOR_ACTIONS", "nodes,defragment")
    with pytest.raises(SystemExit, match="invalid settings: --actions / env GPUSCHED_PREEMPTOR_ACTIONS: "
                                         "unknown action 'defragment' "):
        main(["--bootstrap", "127.0.0.1:9", "--insecure"])
