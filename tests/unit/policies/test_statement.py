"""The statement: random sequences of tentative changes, checkpoints and rollbacks.

Every operation a policy makes on the live state (book, release, take/give while
counting, a reservation's hold and lift, a nomination's cordon) goes through
``Statement``. Rolling back to a checkpoint gives back the state's digest at that
checkpoint exactly, with what was done before it kept; closing gives back the digest
the log made. The views placement builds on the statement (free index, numpy mirror)
stay equal to views built afresh from the nodes after every operation.
"""
from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpusched.core.digest import digest
from gpusched.core.model import JobPhase, NodeStatus
from gpusched.policies.placement.gang import place_gang
from gpusched.policies.placement.registry import make_placement
from gpusched.policies.placement.arrays import NodeArrays, arrays_for
from gpusched.policies.placement.index import FreeIndex
from gpusched.policies.statement import Statement, tentative
from gpusched.policies.preemption.victim_search import worker_slots
from tests.unit.core.builders import Log, make_node, make_spec
from tests.unit.policies.random_preemption import build
from tests.unit.policies.reservation_holds import hold_changes

SETTINGS = settings(max_examples=120, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
OPS = ("place", "release", "count", "hold", "lift", "nominate", "unnominate", "checkpoint", "rollback")


def assert_views_true(statement: Statement) -> None:
    state = statement.state
    arrays = statement.views[("arrays", "default")]
    fresh = NodeArrays(state.nodes, "default")
    for field in ("cpu", "mem", "gpu", "idle"):
        assert np.array_equal(getattr(arrays, field), getattr(fresh, field)), field
    index = statement.views[("free", "default")]
    again = FreeIndex(state.nodes, "default", index.gpu_weight)
    assert index.where == again.where
    for buckets, fresh_buckets in ((index.whole, again.whole), (index.share, again.share)):
        assert {k: v for k, v in buckets.items() if v} == {k: v for k, v in fresh_buckets.items() if v}


@SETTINGS
@given(st.data())
def test_rollback_restores_each_checkpoint_and_close_the_log_state(data):
    log, now = build(data)
    state = log.state
    before = digest(state)
    statement = Statement(state)
    arrays_for(statement, state.nodes, "default")
    statement.views[("free", "default")] = FreeIndex(state.nodes, "default", 10)
    released: set[str] = set()
    holds: list[tuple] = []
    nominated: list[tuple] = []
    checkpoints: list[tuple] = []   # (mark, digest there, the test's bookkeeping there)
    changed = False
    for _ in range(data.draw(st.integers(1, 25))):
        op = data.draw(st.sampled_from(OPS))
        if op == "place":
            pending = [state.jobs[j] for j in state.pending]
            if pending:
                job = data.draw(st.sampled_from(pending))
                placed = place_gang(state, job, make_placement("best-fit"), statement)
                changed |= placed is not None
        elif op == "release":
            holding = [j for j in state.jobs.values() if j.phase.holds_gpus and j.job_id not in released]
            if holding:
                job = data.draw(st.sampled_from(sorted(holding, key=lambda j: j.job_id)))
                statement.release(job)
                released.add(job.job_id)
                changed = True
        elif op == "count":
            node = state.nodes[data.draw(st.sampled_from(sorted(state.nodes)))]
            job = state.jobs[data.draw(st.sampled_from(sorted(state.jobs)))]
            here = digest(state)
            worker_slots(statement, node, job.spec.resources, 4)
            assert digest(state) == here   # counting takes and gives back
        elif op == "hold":
            changes, nodes = hold_changes(state, data)
            statement.hold(changes, nodes)
            holds.append((changes, nodes))
            changed |= bool(changes)
        elif op == "lift" and holds:
            statement.lift(*holds.pop(data.draw(st.integers(0, len(holds) - 1))))
        elif op == "nominate":
            names = data.draw(st.sets(st.sampled_from(sorted(state.nodes))))
            held = statement.nominate(names)
            assert all(n.status is NodeStatus.CORDONED for n in held)
            nominated.append(held)
            changed |= bool(held)
        elif op == "unnominate" and nominated:
            statement.unnominate(nominated.pop(data.draw(st.integers(0, len(nominated) - 1))))
        elif op == "checkpoint":
            checkpoints.append((statement.checkpoint(), digest(state), set(released), list(holds), list(nominated)))
        elif op == "rollback" and checkpoints:
            mark, there, released, holds, nominated = checkpoints[data.draw(st.integers(0, len(checkpoints) - 1))]
            released, holds, nominated = set(released), list(holds), list(nominated)
            checkpoints = [c for c in checkpoints if c[0] <= mark]
            statement.rollback(mark)
            assert digest(state) == there
        assert_views_true(statement)
    if changed and not checkpoints:
        assert statement.checkpoint() > 0
    statement.close()
    assert digest(state) == before
    assert all(n.status is NodeStatus.READY for n in state.nodes.values() if not n.cordoned)


def test_a_booking_before_a_checkpoint_is_kept_by_rolling_back_to_it():
    log = Log(make_node("n1", gpus=4))
    log.submit("a", make_spec(gpus=2))
    log.submit("b", make_spec(gpus=2))
    state = log.state
    with tentative(state) as statement:
        assert place_gang(state, state.jobs["a"], make_placement("best-fit"), statement) is not None
        mark, there = statement.checkpoint(), digest(state)
        assert place_gang(state, state.jobs["b"], make_placement("best-fit"), statement) is not None
        assert state.nodes["n1"].free_whole_gpus() == 0
        statement.rollback(mark)
        assert digest(state) == there
        assert state.nodes["n1"].free_whole_gpus() == 2 and state.nodes["n1"].jobs == {"a"}
    assert state.nodes["n1"].free_whole_gpus() == 4 and not state.nodes["n1"].jobs
    assert state.jobs["a"].phase is JobPhase.PENDING


def test_a_new_team_booked_tentatively_leaves_no_usage_entry():
    log = Log(make_node("n1", gpus=4))
    log.submit("a", make_spec("brand-new", gpus=1))
    state = log.state
    assert "brand-new" not in state.usage
    with tentative(state) as statement:
        place_gang(state, state.jobs["a"], make_placement("best-fit"), statement)
        assert state.usage["brand-new"].jobs == 1
    assert "brand-new" not in state.usage


def test_a_lift_out_of_order_keeps_later_bookings():
    log = Log(make_node("n1", gpus=4))
    log.submit("a", make_spec(gpus=2))
    state = log.state
    node = state.nodes["n1"]
    with tentative(state) as statement:
        held = ((node.gpus[3], "used_milli", 1000), (node, "used_cpu", 500))
        statement.hold(held, ("n1",))
        placed = place_gang(state, state.jobs["a"], make_placement("best-fit"), statement)
        assert placed is not None and 3 not in {s.index for s in placed[0].gpus}
        statement.lift(held, ("n1",))
        assert node.free_whole_gpus() == 2 and node.jobs == {"a"}
        assert node.used_cpu == 1000
    assert node.free_whole_gpus() == 4 and node.used_cpu == 0
