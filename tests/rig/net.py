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
* ``degrade(host, ...)``: latency and loss both ways on the host's link: ``netem``
  where the kernel has it, else a user-space link (``link.py``) spliced between the
  host's veth and the bridge, which drops and delays real frames.

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
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tests.rig.link import no_offloads

LINK = Path(__file__).with_name("link.py")


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
    _links: dict[str, tuple[subprocess.Popen, str]] = field(default_factory=dict)   # host -> (link.py, its veth)

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
            # frames as a wire carries them, so that a user-space link can pass them on
            no_offloads(self.bridge)
            for host in self.hosts.values():
                no_offloads(host.veth)
                sh("ip", "netns", "exec", host.netns, sys.executable, str(LINK), "--no-offloads", "eth0")
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
        """``host``'s packets to ``dsts`` (host names) are dropped until ``undrop(fault)``.
        Faults may overlap (two broker partitions both cut b2 from b3): a route stays
        while any fault that made it holds."""
        ns = self.hosts[host].netns
        for dst in dsts:
            route = (ns, f"{self.address(dst)}/32")
            if not any(route in routes for routes in self._drops.values()):
                sh("ip", "-n", ns, "route", "add", route[1], "via", self.nowhere)
            self._drops.setdefault(fault, []).append(route)

    def undrop(self, fault: str) -> None:
        for route in self._drops.pop(fault, []):
            if not any(route in routes for routes in self._drops.values()):
                sh("ip", "-n", route[0], "route", "del", route[1], check=False)

    def link(self, host: str, up: bool) -> None:
        sh("ip", "link", "set", self.hosts[host].veth, "up" if up else "down")

    def degrade(self, host: str, delay_ms: int = 200, loss_pct: float = 5.0, seed: int = 0) -> str:
        """Latency and loss both ways on ``host``'s link; what was applied, in words."""
        veth = self.hosts[host].veth
        if self._netem is None:
            self._netem = sh("tc", "qdisc", "replace", "dev", veth, "root", "netem", "delay", "1ms",
                             check=False).returncode == 0
            sh("tc", "qdisc", "del", "dev", veth, "root", check=False)
        if self._netem:
            for dev, ns in ((veth, ()), ("eth0", ("-n", self.hosts[host].netns))):
                sh("tc", *ns, "qdisc", "replace", "dev", dev, "root", "netem", "delay", f"{delay_ms}ms",
                   "loss", f"{loss_pct}%")
            return f"netem delay {delay_ms}ms loss {loss_pct}% each way"
        n = list(self.hosts).index(host)
        bridge_side, link_side = f"gsr{self.tag}d{n}", f"gsr{self.tag}e{n}"
        sh("ip", "link", "add", bridge_side, "type", "veth", "peer", "name", link_side)
        for dev in (bridge_side, link_side):
            no_offloads(dev)
        link = subprocess.Popen([sys.executable, str(LINK), veth, link_side, "--delay-ms", str(delay_ms),
                                 "--loss", str(loss_pct / 100), "--seed", str(seed)],
                                stdout=subprocess.PIPE, text=True)
        self._links[host] = (link, bridge_side)
        if link.stdout.readline().strip() != "ready":
            raise RuntimeError(f"link.py for {host} did not start (rc {link.poll()})")
        sh("ip", "link", "set", link_side, "up")
        sh("ip", "link", "set", veth, "nomaster")
        sh("ip", "link", "set", bridge_side, "master", self.bridge)
        sh("ip", "link", "set", bridge_side, "up")
        return f"delay {delay_ms}ms, loss {loss_pct}% each way (user-space link)"

    def clear_degrade(self, host: str) -> str:
        """Back to a plain link; for a user-space one, the frames it passed and dropped."""
        h = self.hosts[host]
        if self._netem:
            sh("tc", "qdisc", "del", "dev", h.veth, "root", check=False)
            sh("tc", "-n", h.netns, "qdisc", "del", "dev", "eth0", "root", check=False)
            return ""
        link, bridge_side = self._links.pop(host, (None, ""))
        if link is None:
            return ""
        sh("ip", "link", "set", h.veth, "master", self.bridge, check=False)
        sh("ip", "link", "del", bridge_side, check=False)   # its peer goes with it
        link.terminate()
        try:
            out, _ = link.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            link.kill()
            out, _ = link.communicate()
        return "; ".join(out.split("\n")).strip("; ")

    def close(self) -> None:
        for fault in list(self._drops):
            self.undrop(fault)
        for host in list(self._links):
            self.clear_degrade(host)
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
