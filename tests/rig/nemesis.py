"""Faults of a real cluster, made on a ``Rig`` at random moments from a seeded RNG, each
healed again, with a record of what was done and when (``Fault``).

Kinds (``KINDS``):

* ``agent-partition``: a node-agent cannot reach any broker (its workers keep running
  until its lease fences them);
* ``broker-partition``: one broker cannot reach the other two, nor they it (clients still
  reach it);
* ``isolate``: the placer's or the preemptor's host loses its link;
* ``degrade``: latency and loss on the link of a broker, an agent or a service;
* ``pause``: SIGSTOP a process (a broker, a service, an agent), SIGCONT at heal;
* ``kill``: SIGKILL a process, started again at heal (an agent with its state dir).

Each fault is held for a while, healed, and followed by a quiet gap; ``at_once`` such
sequences run side by side (2: a second fault may come, or heal, in the middle of the
recovery from the first), never two on one target nor two on brokers (two brokers of
three out is an outage, shown apart).
"""
from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from dataclasses import dataclass, field

from tests.rig.rig import BROKERS, Rig

KINDS = ("agent-partition", "broker-partition", "isolate", "degrade", "pause", "kill")


@dataclass
class Fault:
    kind: str
    target: str
    start: float                 # epoch seconds
    healed: float | None = None
    detail: str = ""

    def __str__(self) -> str:
        held = f"{self.healed - self.start:.1f}s" if self.healed else "unhealed"
        return f"{self.kind:<16} {self.target:<10} held {held:>8} {self.detail}"


@dataclass
class Nemesis:
    rig: Rig
    rng: random.Random
    kinds: tuple[str, ...] = KINDS
    faults: list[Fault] = field(default_factory=list)
    active: list[Fault] = field(default_factory=list)

    def targets(self, kind: str) -> list[str]:
        nodes = self.rig.nodes
        return {"agent-partition": nodes,
                "broker-partition": list(BROKERS),
                "isolate": ["placer", "preemptor"],
                "degrade": [*BROKERS, *nodes, "placer", "preemptor", "admission"],
                "pause": [*BROKERS, *nodes, "placer", "preemptor", "relay"],
                "kill": [*BROKERS, *nodes, "placer", "preemptor", "relay", "admission"]}[kind]

    async def inject(self, kind: str, target: str) -> Fault:
        assert target not in {f.target for f in self.active}, f"{target} is under a fault already"
        net, fault = self.rig.net, Fault(kind, target, time.time())
        fid = f"f{len(self.faults)}"
        # held from now on, so that a fault made side by side meanwhile picks another target
        self.active.append(fault)
        self.faults.append(fault)
        if kind == "agent-partition":
            net.drop(fid, target, list(BROKERS))
        elif kind == "broker-partition":
            others = [b for b in BROKERS if b != target]
            net.drop(fid, target, others)
            for other in others:
                net.drop(fid, other, [target])
        elif kind == "isolate":
            net.link(target, False)
        elif kind == "degrade":
            fault.detail = net.degrade(target, seed=self.rng.randrange(1 << 30))
        elif kind == "pause":
            os.kill(self._pid(target), signal.SIGSTOP)
        elif kind == "kill":
            if target in BROKERS:
                await self.rig.kafka("kill", str(BROKERS.index(target) + 1))
            else:
                await self.rig.service(target).kill9()
        else:
            raise ValueError(kind)
        fault.start = time.time()
        return fault

    async def heal(self, fault: Fault | None = None) -> Fault | None:
        """Heal ``fault`` (default: the one made last of those still active)."""
        if fault is None:
            if not self.active:
                return None
            fault = self.active[-1]
        net, kind, target = self.rig.net, fault.kind, fault.target
        if kind in ("agent-partition", "broker-partition"):
            net.undrop(f"f{self.faults.index(fault)}")
        elif kind == "isolate":
            net.link(target, True)
        elif kind == "degrade":
            passed = net.clear_degrade(target)
            fault.detail += f" ({passed})" if passed else ""
        elif kind == "pause":
            os.kill(self._pid(target), signal.SIGCONT)
        elif kind == "kill":
            if target in BROKERS:
                await self.rig.kafka("start")     # starts the missing node, waits for all three
            else:
                await self.rig.restart(target)
        fault.healed = time.time()
        self.active.remove(fault)    # only now: its target is whole again
        return fault

    def _pid(self, target: str) -> int:
        pid = self.rig.pid_of(target)
        if not pid:
            raise RuntimeError(f"{target} has no process")
        return pid

    async def heal_all(self) -> None:
        while self.active:
            await self.heal()

    async def run(self, seconds: float, hold: tuple[float, float] = (4.0, 8.0),
                  gap: tuple[float, float] = (4.0, 8.0), cycle: bool = True, at_once: int = 1) -> list[Fault]:
        """Faults for ``seconds``: random kinds (``cycle``: each kind in turn, shuffled
        per round, so a short run has each), random targets, random hold and gap;
        ``at_once`` sequences of them side by side."""
        deadline = time.monotonic() + seconds
        order: list[str] = []

        async def sequence() -> None:
            while True:
                await asyncio.sleep(self.rng.uniform(*gap))
                if time.monotonic() + hold[0] > deadline:
                    return   # no time left to hold a fault for its shortest while
                if not order:
                    order.extend(self.kinds)
                    self.rng.shuffle(order)
                kind = order.pop() if cycle else self.rng.choice(self.kinds)
                busy = {f.target for f in self.active}
                if busy & set(BROKERS) or any(f.kind == "broker-partition" for f in self.active):
                    busy |= set(BROKERS)   # one broker fault at a time: two of three is an outage
                free = [t for t in self.targets(kind) if t not in busy]
                if not free:
                    continue
                fault = await self.inject(kind, self.rng.choice(free))
                await asyncio.sleep(min(self.rng.uniform(*hold), max(0.0, deadline - time.monotonic())))
                await self.heal(fault)
        tasks = [asyncio.create_task(sequence()) for _ in range(at_once)]
        try:
            await asyncio.gather(*tasks)
        finally:
            for t in tasks:   # one failed: stop the others before healing what they made
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.heal_all()
        return self.faults
