"""Free ports for the services, the test broker and the benchmarks (gpusched.ports)."""
from __future__ import annotations

import socket

from gpusched.ports import HIGH, LOW, free_port, free_ports


def test_a_run_of_free_ports_lies_below_the_ephemeral_range_and_each_binds():
    port = free_ports(3, "a test")
    assert LOW <= port and port + 2 < HIGH
    socks = [socket.socket() for _ in range(3)]
    try:
        for i, sock in enumerate(socks):
            sock.bind(("127.0.0.1", port + i))
    finally:
        for sock in socks:
            sock.close()


def test_a_free_port_binds_on_the_host_asked():
    for host in ("127.0.0.1", ""):
        port = free_port(host)
        with socket.socket() as sock:
            sock.bind((host, port))
