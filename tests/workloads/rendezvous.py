"""A test workload for a gang: its workers meet over TCP with the environment the
node-agent gives them, as ``torch.distributed``'s TCP store does, and record who met.

    python tests/workloads/rendezvous.py [--hold S] [--hold-attempt N]

Rank 0 listens on ``MASTER_ADDR:MASTER_PORT``; every other rank connects (retrying while
rank 0 is not up yet) and sends its rank and the attempt's rendezvous id; rank 0 answers
each with the ranks that joined, once all ``WORLD_SIZE`` have. A rank from another
rendezvous (a stale worker of an earlier attempt) is refused. Each worker writes what it
saw as one JSON line to ``<cwd>/rendezvous.jsonl``, then stays up ``--hold`` seconds
when its attempt is ``--hold-attempt`` (so a test can kill it), and exits 0.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time

TIMEOUT_S = 60.0


def env(name: str) -> str:
    value = os.environ.get(name)
    if value is None:
        raise SystemExit(f"rendezvous: {name} is not set")
    return value


def serve(address: str, port: int, world: int, rdzv: str) -> list[int]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind((address, port))
        server.listen()
        server.settimeout(TIMEOUT_S)
        peers: list[tuple[socket.socket, int]] = []
        while len(peers) < world - 1:
            conn, _ = server.accept()
            rank, _, their_rdzv = conn.makefile().readline().strip().partition(" ")
            if their_rdzv != rdzv:
                conn.sendall(b"refused\n")
                conn.close()
                continue
            peers.append((conn, int(rank)))
        ranks = sorted([0] + [r for _, r in peers])
        for conn, _ in peers:
            conn.sendall((" ".join(map(str, ranks)) + "\n").encode())
            conn.close()
        return ranks


def join(address: str, port: int, rank: int, rdzv: str) -> list[int]:
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        try:
            with socket.create_connection((address, port), timeout=5) as conn:
                conn.sendall(f"{rank} {rdzv}\n".encode())
                answer = conn.makefile().readline().strip()
            if answer == "refused" or not answer:
                raise SystemExit(f"rendezvous: refused by {address}:{port}")
            return [int(r) for r in answer.split()]
        except (ConnectionRefusedError, ConnectionResetError, socket.timeout):
            if time.monotonic() > deadline:
                raise SystemExit(f"rendezvous: nobody at {address}:{port}")
            time.sleep(0.05)   # rank 0 is not listening yet


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hold", type=float, default=0.0)
    parser.add_argument("--hold-attempt", type=int, default=0)
    args = parser.parse_args(argv)
    address, port = env("MASTER_ADDR"), int(env("MASTER_PORT"))
    rank, world, rdzv = int(env("RANK")), int(env("WORLD_SIZE")), env("GPUSCHED_RDZV_ID")
    started = time.time()
    ranks = serve(address, port, world, rdzv) if rank == 0 else join(address, port, rank, rdzv)
    attempt = int(env("GPUSCHED_ATTEMPT"))
    record = {"rank": rank, "world": world, "ranks": ranks, "port": port, "rdzv": rdzv, "attempt": attempt,
              "job": env("GPUSCHED_JOB_ID"), "pid": os.getpid(), "node_rank": int(env("NODE_RANK")),
              "local_rank": int(env("LOCAL_RANK")), "nodes": env("GPUSCHED_NODELIST"),
              "started": started, "met": time.time()}
    with open("rendezvous.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")
    if attempt == args.hold_attempt and args.hold > 0:
        time.sleep(args.hold)   # held up so the test can kill this worker
    return 0


if __name__ == "__main__":
    sys.exit(main())
