"""The cluster's capacity that fair share's kept queues keep between cycles
(``TeamQueues.capacity``, the denominator of every dominant share) against the capacity
summed afresh from the state, after random changes: placements, ends, requeues, GPUs
failed and back, nodes lost, (re-)registered with other CPU and memory, cordoned and
uncordoned; and the same queues then offered another state."""
from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings, strategies as st

from gpusched.core import events as ev
from gpusched.policies.queueing import shares
from gpusched.policies.queueing.fair_queue import TeamQueues
from gpusched.policies.queueing.shares import QueueContext, cluster_capacity
from tests.unit.core.builders import Log, make_node, make_spec
from tests.unit.policies.kept_ends_steps import NODES
from tests.unit.policies.kept_index_steps import change, step as index_step

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

step = st.one_of(index_step, st.tuples(st.just("resize"), st.integers(0, 2), st.sampled_from((32_000, 64_000))))


def apply(log: Log, s: tuple, made: list[str]) -> None:
    if s[0] == "resize":   # the agent registers again with another inventory of CPU and memory
        log(ev.NodeRegistered, node=make_node(NODES[s[1]], gpus=6, cpu=s[2], mem=s[2] * 8))
    else:
        change(log, s, made)


def new_log() -> Log:
    log = Log(*(make_node(n, gpus=6, cpu=64_000, mem=512_000) for n in NODES))
    for k in range(3):
        assert log.submit(f"w{k}", make_spec("abc"[k], gpus=1, cpu=0, mem=0)).accepted
    return log


@SETTINGS
@given(steps=st.lists(step, max_size=40))
def test_the_kept_capacity_is_the_capacity_summed_afresh(steps):
    log, made, queues = new_log(), [], TeamQueues()
    for s in steps:
        queues.sync(log.state, log.now, math.inf)
        assert queues.capacity(log.state) == cluster_capacity(log.state)
        list(queues.order(log.state, log.now, QueueContext()))   # a cycle's order reads it
        apply(log, s, made)
    queues.sync(log.state, log.now, math.inf)
    assert queues.capacity(log.state) == cluster_capacity(log.state)


def test_a_lost_node_leaves_the_kept_capacity():
    log, queues = new_log(), TeamQueues()
    queues.sync(log.state, log.now, math.inf)
    whole = queues.capacity(log.state)
    assert log(ev.NodeLost, node="n0").accepted
    queues.sync(log.state, log.now, math.inf)
    assert queues.capacity(log.state) == cluster_capacity(log.state) != whole


def test_the_capacity_kept_for_one_state_is_not_read_for_another():
    small, large = Log(make_node("n0", gpus=2)), Log(make_node("n0", gpus=8))
    queues = TeamQueues()
    queues.sync(small.state, small.now, math.inf)
    assert queues.capacity(small.state)[0] == 2_000
    assert queues.capacity(large.state)[0] == 8_000   # not synced to it: summed afresh
    queues.sync(large.state, large.now, math.inf)
    assert queues.capacity(large.state)[0] == 8_000


def test_a_cordon_or_a_failed_gpu_re_adds_only_that_node(monkeypatch):
    """Node events other than a registration change the kept sum by the nodes the reducer
    journalled: no sum over every node (at 5,000 nodes most of what such an event added
    to a cycle)."""
    log, queues = new_log(), TeamQueues()
    queues.sync(log.state, log.now, math.inf)
    queues.capacity(log.state)
    assert log(ev.NodeCordoned, node="n0").accepted
    assert log(ev.GpuHealthChanged, node="n1", gpu_index=2, healthy=False).accepted
    queues.sync(log.state, log.now, math.inf)
    expected = cluster_capacity(log.state)

    def summed(state):
        raise AssertionError("summed over every node")
    monkeypatch.setattr(shares, "cluster_capacity", summed)
    assert queues.capacity(log.state) == expected
