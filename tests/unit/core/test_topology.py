"""A pool's topology levels and a job's topology request (gpusched/core/topology.py):
what validation refuses, naming the field, and what the reducer accepts (PoolTopologySet,
a submission, a placement inside or across a required domain or a slice)."""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.core import events as ev
from gpusched.core.model import JobSpec, TopologyRequest, TopologySlice, WorkerResources
from gpusched.core.queries import pool_summary
from gpusched.core.topology import DEFAULT_LEVELS, MAX_LEVELS, check_levels, request_problems, shape_problems
from gpusched.core.validation import check_spec_alone

from .builders import Log, make_node, whole


def _spec(workers: int = 4, required: str = "", preferred: str = "", slice_level: str = "",
          slice_workers: int = 0, pool: str = "default") -> JobSpec:
    return JobSpec(name="g", team="t", pool=pool, workers=workers, resources=WorkerResources(gpus=1),
                   topology=TopologyRequest(required, preferred, TopologySlice(slice_level, slice_workers)))


# --- validation tables ---------------------------------------------------------------
@pytest.mark.parametrize("levels, field", [
    ((), ""), (("rack",), ""), (("spine", "rack", "block"), ""), (("topology.kubernetes.io/zone", "rack"), ""),
    (tuple(f"l{i}" for i in range(MAX_LEVELS)), ""),
    (tuple(f"l{i}" for i in range(MAX_LEVELS + 1)), "levels"),
    (("rack", "bad level"), "levels[1]"), (("",), "levels[0]"), (("rack", "-x"), "levels[1]"),
    (("a" * 65,), "levels[0]"), (("spine", "rack", "spine"), "levels"),
])
def test_check_levels_names_the_field(levels, field):
    problem = check_levels(levels)
    assert problem.split(":")[0] == field if field else problem == ""


@pytest.mark.parametrize("spec, fields", [
    (_spec(), []),
    (_spec(required="rack", preferred="block", slice_level="block", slice_workers=2), []),
    (_spec(required="bad level"), ["spec.topology.required"]),
    (_spec(preferred="x y"), ["spec.topology.preferred"]),
    (_spec(slice_level="block"), ["spec.topology.slice"]),
    (_spec(slice_workers=2), ["spec.topology.slice"]),
    (_spec(slice_level="block", slice_workers=3), ["spec.topology.slice.workers"]),
    (_spec(slice_level="block", slice_workers=8), ["spec.topology.slice.workers"]),
    (_spec(slice_level="block", slice_workers=-2), ["spec.topology.slice.workers"]),
    (_spec(workers=4, slice_level="block", slice_workers=4), []),
])
def test_shape_problems_name_each_field(spec, fields):
    assert [f for f, _ in shape_problems(spec)] == fields
    assert [e.field for e in check_spec_alone(spec)] == fields   # the reducer's and admission's rules


LEVELS = ("spine", "rack", "block")


@pytest.mark.parametrize("spec, fields", [
    (_spec(), []),
    (_spec(required="rack", preferred="block", slice_level="block", slice_workers=2), []),
    (_spec(required="rack", slice_level="rack", slice_workers=2), []),
    (_spec(required="zone"), ["spec.topology.required"]),
    (_spec(required="zone", preferred="row", slice_level="node", slice_workers=2),
     ["spec.topology.required", "spec.topology.preferred", "spec.topology.slice.level"]),
    (_spec(required="rack", preferred="rack"), ["spec.topology.preferred"]),
    (_spec(required="rack", preferred="spine"), ["spec.topology.preferred"]),
    (_spec(required="block", slice_level="rack", slice_workers=2), ["spec.topology.slice.level"]),
])
def test_request_problems_against_the_pools_levels(spec, fields):
    assert [f for f, _ in request_problems(spec, LEVELS)] == fields


def test_the_default_levels_know_spine_and_rack_only():
    assert [f for f, _ in request_problems(_spec(required="rack"), DEFAULT_LEVELS)] == []
    assert [f for f, _ in request_problems(_spec(required="block"), DEFAULT_LEVELS)] == ["spec.topology.required"]


_level = st.text(st.sampled_from("ab-./ _"), min_size=0, max_size=6)


@settings(max_examples=200, deadline=None)
@given(levels=st.lists(_level, max_size=MAX_LEVELS + 2))
def test_levels_check_levels_accepts_are_what_the_reducer_keeps(levels):
    """check_levels is the reducer's rule: accepted levels are kept as given, refused
    ones leave the pool's levels as they were."""
    log = Log()
    problem = check_levels(levels)
    out = log(ev.PoolTopologySet, pool="default", levels=tuple(levels))
    assert out.accepted == (problem == "")
    assert log.state.pool_topology.get("default", ()) == (tuple(levels) if out.accepted else ())


# --- the reducer -----------------------------------------------------------------------
def _node(name: str, spine: str, rack: str):
    return dataclasses.replace(make_node(name, gpus=2), labels=(("rack", rack), ("spine", spine)))


def _racks() -> Log:
    """Four nodes: n1, n2 in rack r1 and n3 in rack r2 of spine s1; n4 in rack r1 of spine s2."""
    return Log(_node("n1", "s1", "r1"), _node("n2", "s1", "r1"), _node("n3", "s1", "r2"), _node("n4", "s2", "r1"))


def test_pool_topology_set_is_kept_shown_and_reset():
    log = _racks()
    assert pool_summary(log.state, "default").topology_levels == DEFAULT_LEVELS
    assert log(ev.PoolTopologySet, pool="default", levels=("spine", "rack", "block")).accepted
    assert log.state.pool_topology == {"default": ("spine", "rack", "block")}
    assert pool_summary(log.state, "default").topology_levels == ("spine", "rack", "block")
    out = log(ev.PoolTopologySet, pool="default", levels=("rack", "bad level"))
    assert not out.accepted and "levels[1]" in out.reason
    assert not log(ev.PoolTopologySet, pool="", levels=("rack",)).accepted
    assert log.state.pool_topology == {"default": ("spine", "rack", "block")}
    assert log(ev.PoolTopologySet, pool="default", levels=()).accepted
    assert log.state.pool_topology == {} and pool_summary(log.state, "default").topology_levels == DEFAULT_LEVELS


def test_a_submission_naming_a_level_its_pool_lacks_is_refused():
    log = _racks()
    out = log.submit("g", _spec(workers=2, required="block"))
    assert not out.accepted and "spec.topology.required" in out.reason and "g" not in log.state.jobs
    assert log(ev.PoolTopologySet, pool="default", levels=("spine", "rack", "block")).accepted
    assert log.submit("g", _spec(workers=2, required="block")).accepted


def test_a_placement_crossing_a_required_rack_is_refused_and_one_inside_it_accepted():
    log = _racks()
    assert log.submit("g", _spec(workers=2, required="rack")).accepted
    # n1 (s1/r1) and n3 (s1/r2): two racks
    out = log.place("g", ("n1", whole(0)), ("n3", whole(0)))
    assert not out.accepted and "'rack'" in out.reason
    # n1 and n4: both labelled r1, but under two spines, so two domains
    assert not log.place("g", ("n1", whole(0)), ("n4", whole(0))).accepted
    assert log.place("g", ("n1", whole(0)), ("n2", whole(0))).accepted


def test_a_placement_splitting_a_slice_is_refused():
    log = _racks()
    assert log.submit("g", _spec(workers=4, slice_level="rack", slice_workers=2)).accepted
    # workers 0, 1 in r1 and 2, 3 in r2: each slice in one rack (the gang spans two)
    split = log.place("g", ("n1", whole(0)), ("n3", whole(0)), ("n2", whole(0)), ("n3", whole(1)))
    assert not split.accepted and "slice 0" in split.reason
    assert log.place("g", ("n1", whole(0)), ("n2", whole(0)), ("n3", whole(0)), ("n3", whole(1))).accepted


def test_a_job_without_a_request_may_span_racks():
    log = _racks()
    assert log.submit("g", _spec(workers=2)).accepted
    assert log.place("g", ("n1", whole(0)), ("n3", whole(0))).accepted
