"""The node lease file: renew, revoke, and what counts as expired; and when the agent
renews it (never a lease that ran out while work may still run under it)."""
from __future__ import annotations

import asyncio
import math
import time

import pytest

from gpusched_node_agent.lease import NodeLease, read_expiry
from gpusched_node_agent.liveness import NodeLiveness
from tests.unit.core.builders import make_node


def test_renew_and_revoke(tmp_path):
    lease = NodeLease(tmp_path / "node" / "lease")
    lease.renew(1234.5)
    assert read_expiry(lease.path) == 1234.5 and lease.expiry() == 1234.5
    before = time.time()
    lease.revoke()
    assert before <= read_expiry(lease.path) <= time.time()
    assert [p.name for p in lease.path.parent.iterdir()] == ["lease"]   # no temp files left


@pytest.mark.parametrize("text", ["", "soon", "nan", "inf", "1e400", "\xff"])
def test_garbled_lease_reads_expired(tmp_path, text):
    (tmp_path / "lease").write_text(text, encoding="latin-1")
    assert read_expiry(tmp_path / "lease") == 0.0


def test_missing_lease_reads_expired(tmp_path):
    assert read_expiry(tmp_path / "absent") == 0.0


@pytest.mark.parametrize("until", [math.nan, math.inf, "10", None, True])
def test_renew_refuses_what_is_not_a_time(tmp_path, until):
    with pytest.raises(ValueError, match="'until'"):
        NodeLease(tmp_path / "lease").renew(until)


def test_whitespace_around_the_expiry_is_ignored(tmp_path):
    (tmp_path / "lease").write_text(" 1234.5\n", encoding="ascii")
    assert read_expiry(tmp_path / "lease") == 1234.5


# --- the agent's renewals (NodeLiveness.beat) -------------------------------------------
class _Publisher:
    """Acknowledges every heartbeat at once."""

    class topics:
        prefix = "t."

    async def send_raw(self, topic, value, key=None):
        return None


class _Agent(NodeLiveness):
    def __init__(self, path, lease_s: float = 10.0) -> None:
        self.info = make_node("n0", lease=lease_s)
        self.publisher = _Publisher()
        self.lease = NodeLease(path)
        self.runs = {}
        self.running = {}
        self.name = self.info.name


class _Run:
    def __init__(self, under_lease: bool) -> None:
        self.under_lease = under_lease


@pytest.mark.parametrize("running, settling, renewed", [
    (False, False, True),    # nothing runs under it: a new lease
    (True, False, False),    # workers whose shims are fencing them
    (False, True, False),    # an earlier life's workers, not yet taken over or ended
    (None, False, True),     # a worker waiting to start runs nothing under it yet
])
async def test_a_lease_that_ran_out_is_renewed_only_once_nothing_runs_under_it(tmp_path, running, settling,
                                                                              renewed):
    agent = _Agent(tmp_path / "lease")
    agent.lease.revoke()                          # ran out (a revoke, or a long silence)
    agent.runs = {} if running is False else {("j", 0, 0): _Run(under_lease=bool(running))}
    agent.settling = settling
    before = agent.lease.expiry()
    assert await agent.beat()
    assert (agent.lease.expiry() > time.time() + 5) is renewed
    if not renewed:
        assert agent.lease.expiry() == before


async def test_a_lease_that_holds_is_renewed_while_workers_run(tmp_path):
    agent = _Agent(tmp_path / "lease")
    agent.lease.renew(time.time() + 3)
    agent.runs = {("j", 0, 0): _Run(under_lease=True)}
    assert await agent.beat()
    assert agent.lease.expiry() > time.time() + 9


async def test_a_worker_waits_for_a_valid_lease_and_starts_on_its_renewal(tmp_path):
    """A placement that comes while the lease is lapsed waits (its shim would refuse it,
    and the refusal would bounce the job); a renewal, or a stop, lets it go on."""
    agent = _Agent(tmp_path / "lease")
    agent.lease.revoke()
    agent.runs = {("old", 0, 0): _Run(under_lease=True)}      # a fenced worker still ending
    waiting = asyncio.ensure_future(agent.lease_held(lambda: False))
    await agent.beat()                                         # refused: the old worker runs under it
    await asyncio.sleep(0)
    assert not waiting.done()
    agent.runs = {}                                            # it ended
    await agent.beat()
    await asyncio.wait_for(waiting, 5)
    assert agent.lease.expiry() > time.time()
    agent.lease.revoke()
    stopped = []
    waiting = asyncio.ensure_future(agent.lease_held(lambda: bool(stopped)))
    await asyncio.sleep(0)
    stopped.append(True)
    agent.lease_changed.set()                                  # what NodeAgent._stop does
    await asyncio.wait_for(waiting, 5)
