"""The rig's network faults do what they say, measured by TCP between two of its hosts:
a degraded link delays every round trip by twice its delay and drops frames at about its
loss rate (counted by the link itself), a healed one is fast again; a dropped route
leaves a connection unanswered until it is undone. Root only (network namespaces)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest

from tests.rig.net import Net, sh

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("ip"),
                                reason="needs root and iproute2 (network namespaces)")

ECHO = """
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('0.0.0.0', 7000)); s.listen(); print('listening', flush=True)
while True:
    c, _ = s.accept()
    while (d := c.recv(65536)):
        c.sendall(d)
    c.close()
"""
# round trips of one byte (their median), then 1 MB echoed; "timeout" if unanswered
PROBE = """
import socket, statistics, sys, time
try:
    s = socket.create_connection((sys.argv[1], 7000), timeout=float(sys.argv[2]))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    rtts = []
    for _ in range(9):
        t = time.monotonic(); s.sendall(b'x'); s.recv(1); rtts.append(time.monotonic() - t)
    data = b'y' * 1_000_000; t = time.monotonic(); s.sendall(data); got = 0
    while got < len(data):
        got += len(s.recv(1 << 20))
    print(statistics.median(rtts), time.monotonic() - t)
except OSError:
    print('timeout')
"""


@pytest.fixture
def net():
    n = Net().open(["a", "b"])
    server = subprocess.Popen(["ip", "netns", "exec", n.hosts["a"].netns, sys.executable, "-c", ECHO],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().strip() == "listening"
        yield n
    finally:
        server.kill()
        server.wait()
        n.close()
        assert n.leftovers() == []


def probe(net: Net, timeout: float = 30.0) -> tuple[float, float] | None:
    out = sh("ip", "netns", "exec", net.hosts["b"].netns, sys.executable, "-c", PROBE,
             net.address("a"), str(timeout)).stdout.split()
    return None if out == ["timeout"] else (float(out[0]), float(out[1]))


def test_a_degraded_link_delays_and_drops_real_frames_both_ways(net):
    rtt, _ = probe(net)
    assert rtt < 0.05
    net.degrade("a", delay_ms=100, loss_pct=5.0, seed=3)
    slow, _ = probe(net)
    counts = net.clear_degrade("a")
    assert slow >= 0.2, f"a round trip crosses the link twice: {slow:.3f}s"
    # "from X: passed P, dropped D; from Y: ..."
    sides = [part.split(": ")[1] for part in counts.split("; ")]
    passed = [int(s.split(", ")[0].split()[1]) for s in sides]
    dropped = [int(s.split(", ")[1].split()[1]) for s in sides]
    assert all(p > 100 for p in passed), counts
    assert 0.01 < sum(dropped) / (sum(passed) + sum(dropped)) < 0.12, counts
    healed, _ = probe(net)
    assert healed < 0.05


def test_a_dropped_route_goes_unanswered_until_undone(net):
    net.drop("f0", "b", ["a"])
    start = time.monotonic()
    assert probe(net, timeout=2.0) is None
    assert time.monotonic() - start >= 1.5   # unanswered, not refused at once
    net.undrop("f0")
    assert probe(net) is not None


def test_overlapping_drops_hold_until_the_last_is_undone(net):
    net.drop("f0", "b", ["a"])
    net.drop("f1", "b", ["a"])       # a second fault on the same route
    net.undrop("f0")
    assert probe(net, timeout=2.0) is None
    net.undrop("f1")
    assert probe(net) is not None
