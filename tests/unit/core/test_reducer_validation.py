"""The reducer refuses what admission would refuse: a forged or buggy ``JobSubmitted``
(negative GPUs, oversized fields, a pool that does not exist) creates no job."""
from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.core import events as ev
from gpusched.core.model import JobSpec, WorkerResources
from gpusched.core.reducer import apply
from gpusched.core.state import ClusterState
from gpusched.core.validation import MAX_COMMAND_ARGS, MAX_NAME, check_spec_alone
from tests.unit.core.builders import Log, make_node, make_spec


def _forged(**changes) -> JobSpec:
    spec = make_spec(gpus=1)
    resources = {k[len("r_"):]: v for k, v in changes.items() if k.startswith("r_")}
    rest = {k: v for k, v in changes.items() if not k.startswith("r_")}
    return dataclasses.replace(spec, resources=dataclasses.replace(spec.resources, **resources), **rest)


FORGED = [
    (_forged(r_gpus=-4), "spec.resources.gpus"),
    (_forged(workers=0), "spec.workers"),
    (_forged(team=""), "spec.team"),
    (_forged(team="a" * (MAX_NAME + 1)), "spec.team"),
    (_forged(team="ok\n"), "spec.team"),
    (_forged(org="x" * 3_000_000), "spec.org"),
    (_forged(command=("x",) * (MAX_COMMAND_ARGS + 1)), "spec.command"),
    (_forged(priority_class="god-mode"), "spec.priority_class"),
    (_forged(command=("echo", "a\x00b")), "spec.command[1]"),
    (_forged(max_runtime_s=float("nan")), "spec.max_runtime_s"),
    (_forged(r_gpu_milli=-1, r_gpus=0), "spec.resources.gpu_milli"),
    (_forged(pool="nowhere"), "spec.pool"),
]


def test_each_forged_job_submitted_is_rejected_naming_the_field_and_creates_nothing():
    for spec, field in FORGED:
        log = Log(make_node("n1"))
        out = log.submit("forged", spec)
        assert not out.accepted and field in out.reason, (field, out.reason[:200])
        assert "forged" not in log.state.jobs and not log.state.pending


def test_a_pool_exists_once_a_node_registered_in_it_or_an_operator_created_it():
    log = Log()
    assert not log.submit("early", pool="gpu-b").accepted
    assert log(ev.NodeRegistered, node=make_node("b1", pool="gpu-b")).accepted
    assert log.submit("b", pool="gpu-b").accepted
    assert not log.submit("c0", pool="gpu-c").accepted
    assert log(ev.PoolCreated, pool="gpu-c").accepted
    assert log.submit("c", pool="gpu-c").accepted
    assert not log(ev.PoolCreated, pool="gpu-c").accepted          # exists already
    assert not log(ev.PoolCreated, pool="bad pool\n").accepted     # not a pool name
    assert list(log.state.pools) == ["default", "gpu-b", "gpu-c"]


def test_a_state_restored_without_pools_still_knows_the_pools_of_its_nodes():
    """A snapshot written before pools were recorded: the nodes' pools still exist."""
    log = Log(make_node("n1", pool="old"))
    log.state.pools.clear()
    assert log.submit("j", pool="old").accepted
    assert "old" in log.state.pools


_specs = st.builds(
    JobSpec,
    name=st.sampled_from(["job", "", "x" * 300, "a b"]),
    team=st.sampled_from(["team-a", "", "t\n", "t" * 254]),
    pool=st.sampled_from(["default", "nowhere", ""]),
    priority_class=st.sampled_from(["training", "production", "nope"]),
    workers=st.integers(-2, 5000),
    resources=st.builds(WorkerResources, gpus=st.integers(-2, 9), gpu_milli=st.integers(-1, 1200),
                        mig_profile=st.sampled_from(["", "3g", "9g"]), cpu_milli=st.integers(-1, 4000),
                        memory_mib=st.integers(-1, 4000)),
    max_runtime_s=st.floats(allow_nan=True, allow_infinity=True),
    command=st.lists(st.text(max_size=5), max_size=3).map(tuple),
)


@settings(max_examples=300, deadline=None)
@given(_specs)
def test_the_reducer_accepts_a_spec_exactly_when_the_spec_rules_and_the_known_pools_do(spec):
    state = ClusterState()
    state.pools["default"] = None
    out = apply(state, ev.JobSubmitted(event_id="e", time=1.0, job_id="j", spec=spec))
    valid = not check_spec_alone(spec) and spec.pool == "default"
    assert out.accepted == valid, out.reason
    assert ("j" in state.jobs) == valid
