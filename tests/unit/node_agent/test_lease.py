"""The node lease file: renew, revoke, and what counts as expired."""
from __future__ import annotations

import math
import time

import pytest

from gpusched_node_agent.lease import NodeLease, read_expiry


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
