"""A lossy, slow link in user space, for kernels without ``netem`` (the rig's ``degrade``).

It joins two interfaces of the root namespace, frame by frame, through raw packet
sockets: the bridge side of a host's veth (taken off the bridge) and one end of a new
veth pair whose other end is on the bridge. Each frame, either way, is dropped with
probability ``loss`` or sent on after ``delay`` seconds (plus up to ``jitter``, never
reordering), so TCP between the host and the rest sees real lost packets, real
retransmissions and a real round trip of twice the delay.

Frames must be what the wire would carry: no segmentation or checksum offload, or a
raw socket reads 64 KiB super-frames and unfinished checksums. ``no_offloads`` turns
those off on an interface (the rig does it for every host's interface and the bridge)
through the ethtool ioctl, so nothing has to be installed.

    python tests/rig/link.py A B --delay-ms 200 --loss 0.05 --seed 1

prints ``ready`` once both sockets are bound and runs until killed; on SIGTERM it prints
the frames it passed and dropped each way.
"""
from __future__ import annotations

import argparse
import ctypes
import fcntl
import heapq
import random
import select
import signal
import socket
import struct
import sys
import time

ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4            # a frame this host sent: seen by a packet socket too, not ours to pass
SIOCETHTOOL = 0x8946
# legacy ethtool "set" commands (struct ethtool_value {u32 cmd; u32 data;})
ETHTOOL_STXCSUM, ETHTOOL_SSG, ETHTOOL_STSO, ETHTOOL_SGSO, ETHTOOL_SGRO = 0x17, 0x19, 0x1F, 0x24, 0x2C


def no_offloads(ifname: str) -> None:
    """Checksums, scatter-gather, TSO, GSO and GRO off on ``ifname`` (this namespace)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for cmd in (ETHTOOL_SGRO, ETHTOOL_SGSO, ETHTOOL_STSO, ETHTOOL_SSG, ETHTOOL_STXCSUM):
            value = ctypes.create_string_buffer(struct.pack("II", cmd, 0))
            ifreq = struct.pack("16sP", ifname.encode(), ctypes.addressof(value)).ljust(40, b"\0")
            try:
                fcntl.ioctl(s, SIOCETHTOOL, ifreq)
            except OSError as exc:
                # some (bridges: GRO) cannot be set; what matters is what a packet socket reads
                if cmd in (ETHTOOL_STXCSUM, ETHTOOL_STSO, ETHTOOL_SGSO):
                    raise RuntimeError(f"{ifname}: ethtool set 0x{cmd:x}: {exc}") from exc


def _bound(ifname: str) -> socket.socket:
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    s.bind((ifname, 0))
    s.setblocking(False)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    return s


def run(a: str, b: str, delay: float, loss: float, jitter: float, rng: random.Random) -> dict[str, list[int]]:
    socks = {a: _bound(a), b: _bound(b)}
    other = {a: b, b: a}
    counts = {a: [0, 0], b: [0, 0]}          # frames read from each side: [passed, dropped]
    queue: list[tuple[float, int, str, bytes]] = []   # (due, seq, out interface, frame)
    last_due = {a: 0.0, b: 0.0}
    seq = 0
    stop = False

    def on_term(*_):
        nonlocal stop
        stop = True
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    print("ready", flush=True)
    by_fd = {s.fileno(): name for name, s in socks.items()}
    poller = select.poll()
    for fd in by_fd:
        poller.register(fd, select.POLLIN)
    while not stop:
        timeout = max(0.0, queue[0][0] - time.monotonic()) if queue else 0.5
        try:
            ready = poller.poll(timeout * 1000)
        except InterruptedError:
            continue
        now = time.monotonic()
        for fd, _ in ready:
            side = by_fd[fd]
            while True:
                try:
                    frame, addr = socks[side].recvfrom(65536)
                except BlockingIOError:
                    break
                except OSError:   # ENETDOWN, reported once after an interface went down
                    break
                if addr[2] == PACKET_OUTGOING:
                    continue
                if rng.random() < loss:
                    counts[side][1] += 1
                    continue
                counts[side][0] += 1
                out = other[side]
                due = max(last_due[out], now + delay + rng.uniform(0, jitter))
                last_due[out] = due
                seq += 1
                heapq.heappush(queue, (due, seq, out, frame))
        now = time.monotonic()
        while queue and queue[0][0] <= now:
            _, _, out, frame = heapq.heappop(queue)
            try:
                socks[out].send(frame)
            except OSError:
                pass      # a full queue or a link going down: lost, as on a wire
    return counts


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("a", nargs="?")
    p.add_argument("b", nargs="?")
    p.add_argument("--delay-ms", type=float, default=200.0)
    p.add_argument("--jitter-ms", type=float, default=0.0)
    p.add_argument("--loss", type=float, default=0.05, help="probability a frame is dropped")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-offloads", nargs="+", metavar="IFNAME", help="only turn offloads off on these, then exit")
    args = p.parse_args()
    if args.no_offloads:
        for name in args.no_offloads:
            no_offloads(name)
        return 0
    if not (args.a and args.b):
        p.error("two interfaces to join")
    counts = run(args.a, args.b, args.delay_ms / 1000, args.loss, args.jitter_ms / 1000, random.Random(args.seed))
    for side, (passed, dropped) in counts.items():
        print(f"from {side}: passed {passed}, dropped {dropped}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
