"""The rig's network: a Linux bridge in the root namespace and one network namespace per
host, joined to it by a veth pair, each with an address of its own on a /24 that this
module picks (10.77.N.0/24, N free on this machine). The bridge has the address .254,
so the test process (root namespace) reaches every host as a client.

Faults, all undone by ``heal``/``close``:

* ``drop(fault, host, dsts)``: the host's packets to those hosts are dropped: a
  route for each in the host's namespace via an address nobody holds (.253), so they
  go unanswered as on a real partition, not refused at once as a blackhole route's
  would be (a drop one way stalls TCP both ways; callers add the other direction where
  they want it);
* ``link(host, False)``: the bridge side of the host's veth is down (a pulled cable);
* ``degrade(host, ...)``: latency and loss on the bridge side (packets towards the
  host): ``netem`` where the kernel has it, else a ``tbf`` rate limit whose queue
  delays packets and drops those that would wait longer than its latency.

Why routes and not ``tc filter ... action drop``: kernels without the u32 classifier or
the gact action (as some CI sandboxes are) still route.

Root only (``ip netns``, ``ip route``, ``tc``); no iptables. ``close`` removes every namespace, veth
and the bridge, also after a failure half way through ``open``.
"""
from __future__ import annotations

import ipaddress
import itertools
import secrets
import subprocess
from dataclasses import dataclass, field


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run(args, text=True, capture_output=True)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: rc {p.returncode}: {p.stderr.strip()}")
    return p


def _free_subnet() -> int:
    used = sh("ip", "-o", "addr", "show").stdout + sh("ip", "route", "show").stdout
    for n in itertools.chain(range(77, 250), range(1, 77)):
        if f"10.77.{n}." not in used:
            return n
    raise RuntimeError("no free 10.77.N.0/24 on this machine")


@dataclass
class Host:
    name: str          # the rig's name for it: b1, admission, n0 ...
    netns: str         # its network namespace
    address: str
    veth: str          # the bridge side of its veth pair (root namespace)


@dataclass
class Net:
    tag: str = field(default_factory=lambda: secrets.token_hex(2))
    hosts: dict[str, Host] = field(default_factory=dict)
    bridge: str = ""
    subnet: int = 0
    _drops: dict[str, list[tuple[str, str]]] = field(default_factory=dict)   # fault id -> (netns, address)
    _netem: bool | None = None

    @property
    def gateway(self) -> str:
        return f"10.77.{self.subnet}.254"

    @property
    def nowhere(self) -> str:
        return f"10.77.{self.subnet}.253"

    def open(self, names: list[str]) -> "Net":
        try:
            self.subnet = _free_subnet()
            self.bridge = f"gsr{self.tag}"
            sh("ip", "link", "add", self.bridge, "type", "bridge")
            sh("ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            sh("ip", "link", "set", self.bridge, "up")
            for i, name in enumerate(names, start=1):
                self.add_host(name, f"10.77.{self.subnet}.{i}")
        except BaseException:
            self.close()
            raise
        return self

    def add_host(self, name: str, address: str) -> Host:
        n = len(self.hosts)
        host = Host(name, f"gsr{self.tag}-{name}", address, f"gsr{self.tag}h{n}")
        self.hosts[name] = host
        sh("ip", "netns", "add", host.netns)
        inner = f"gsr{self.tag}i{n}"
        sh("ip", "link", "add", host.veth, "type", "veth", "peer", "name", inner)
        sh("ip", "link", "set", inner, "netns", host.netns)
        sh("ip", "link", "set", host.veth, "master", self.bridge)
        sh("ip", "link", "set", host.veth, "up")
        ns = ("ip", "-n", host.netns)
        sh(*ns, "link", "set", inner, "name", "eth0")
        sh(*ns, "addr", "add", f"{address}/24", "dev", "eth0")
        sh(*ns, "link", "set", "eth0", "up")
        sh(*ns, "link", "set", "lo", "up")
        return host

    def address(self, name: str) -> str:
        return self.hosts[name].address

    # --- faults ---
    def drop(self, fault: str, host: str, dsts: list[str]) -> None:
        """``host``'s packets to ``dsts`` (host names) are dropped until ``undrop(fault)``."""
        ns = self.hosts[host].netns
        for dst in dsts:
            address = f"{self.address(dst)}/32"
            sh("ip", "-n", ns, "route", "add", address, "via", self.nowhere)
            self._drops.setdefault(fault, []).append((ns, address))

    def undrop(self, fault: str) -> None:
        for ns, address in self._drops.pop(fault, []):
            sh("ip", "-n", ns, "route", "del", address, check=False)

    def link(self, host: str, up: bool) -> None:
        sh("ip", "link", "set", self.hosts[host].veth, "up" if up else "down")

    def degrade(self, host: str, delay_ms: int = 200, loss_pct: float = 5.0, rate_kbit: int = 512) -> str:
        """Latency and loss towards ``host``; what was applied, in words."""
        veth = self.hosts[host].veth
        if self._netem is None:
            self._netem = sh("tc", "qdisc", "replace", "dev", veth, "root", "netem", "delay", "1ms",
                             check=False).returncode == 0
        if self._netem:
            sh("tc", "qdisc", "replace", "dev", veth, "root", "netem", "delay", f"{delay_ms}ms",
               f"{delay_ms // 4}ms", "loss", f"{loss_pct}%")
            return f"netem delay {delay_ms}ms loss {loss_pct}%"
        sh("tc", "qdisc", "replace", "dev", veth, "root", "tbf", "rate", f"{rate_kbit}kbit", "burst", "4kb",
           "latency", f"{delay_ms}ms")
        return f"tbf rate {rate_kbit}kbit, queue up to {delay_ms}ms, tail drop beyond"

    def clear_degrade(self, host: str) -> None:
        sh("tc", "qdisc", "del", "dev", self.hosts[host].veth, "root", check=False)

    def close(self) -> None:
        for fault in list(self._drops):
            self.undrop(fault)
        for host in self.hosts.values():
            sh("ip", "link", "del", host.veth, check=False)     # its peer goes with it
            sh("ip", "netns", "del", host.netns, check=False)
        if self.bridge:
            sh("ip", "link", "del", self.bridge, check=False)
        self.hosts.clear()

    def leftovers(self) -> list[str]:
        """This rig's namespaces and links still on the machine (none after ``close``)."""
        found = [line for line in sh("ip", "netns", "list").stdout.splitlines() if f"gsr{self.tag}" in line]
        found += [line for line in sh("ip", "-o", "link").stdout.splitlines() if f"gsr{self.tag}" in line]
        return found


def in_subnet(address: str, subnet: int) -> bool:
    return ipaddress.ip_address(address) in ipaddress.ip_network(f"10.77.{subnet}.0/24")
