"""Which nodes are lost (``supervision.lost_nodes``): never one whose lease may still
run, whatever the heartbeat timeout; the agent's side of the bound (it never renews a
lease that ran out while work may still run under it) is in tests/unit/node_agent."""
from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from gpusched.core import events as ev
from gpusched.core.reducer import apply
from gpusched.core.state import ClusterState
from gpusched.policies.supervision import LEASE_MARGIN_S, SupervisionConfig, lost_nodes
from tests.unit.core.builders import make_node


def _cluster(*leases: float) -> ClusterState:
    state = ClusterState()
    for i, lease in enumerate(leases):
        apply(state, ev.NodeRegistered(event_id=f"r{i}", time=0.0, producer="t",
                                       node=make_node(f"n{i}", lease=lease, kill_wait=2.0)))
    return state


@pytest.mark.parametrize("lease, timeout, silent, lost", [
    (0.0, 10.0, 10.5, True),      # nothing runs under a lease: the timeout alone
    (0.0, 10.0, 9.5, False),
    (5.0, 10.0, 10.5, True),      # a lease shorter than the timeout changes nothing
    (15.0, 10.0, 12.0, False),    # a longer lease: silence must outlast it and the margin
    (15.0, 10.0, 15.0 + LEASE_MARGIN_S + 0.5, True),
    (10.0, 10.0, 10.5, False),    # equal: the margin still applies
])
def test_a_node_is_lost_only_once_its_lease_surely_ran_out(lease, timeout, silent, lost):
    state = _cluster(lease)
    found = lost_nodes(state, {"n0": 100.0}, 0.0, 100.0 + silent, SupervisionConfig(heartbeat_timeout_s=timeout))
    assert [name for name, _ in found] == (["n0"] if lost else [])
    if lost:
        assert f"timeout {max(timeout, lease + LEASE_MARGIN_S if lease else 0):g}s" in found[0][1]


@given(lease=st.floats(0.0, 120.0), timeout=st.floats(0.5, 120.0), silent=st.floats(0.0, 300.0))
def test_when_a_node_is_declared_lost_its_last_lease_has_run_out(lease, timeout, silent):
    """The last heartbeat heard was sent no later than it was heard (``seen``), so the
    lease it renewed ran out by ``seen + lease``: at least the margin before the verdict."""
    state = _cluster(lease)
    seen = 1000.0
    if lost_nodes(state, {"n0": seen}, 0.0, seen + silent, SupervisionConfig(heartbeat_timeout_s=timeout)):
        assert lease == 0.0 or seen + lease + LEASE_MARGIN_S < seen + silent
