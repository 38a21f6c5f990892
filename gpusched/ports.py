"""Free TCP ports on this host, for the services, tests and benchmarks that start
listeners of their own (a rendezvous, a test broker, a Slurm cluster)."""
from __future__ import annotations

import random
import socket

LOW, HIGH = 20000, 32000    # below the kernel's ephemeral range (32768-): clients do not take them meanwhile


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` now (the kernel's choice; "" for every interface)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def free_ports(count: int, what: str = "listeners") -> int:
    """A port p with p .. p+count-1 free on 127.0.0.1 now, below the ephemeral range
    (for services that take consecutive ports); RuntimeError naming ``what`` if none."""
    for _ in range(200):
        port = random.randrange(LOW, HIGH - count)
        socks = [socket.socket() for _ in range(count)]
        try:
            for i, sock in enumerate(socks):
                sock.bind(("127.0.0.1", port + i))
            return port
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise RuntimeError(f"no {count} free ports in a row for {what}")
