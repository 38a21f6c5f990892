"""What tells the cluster that a node agent is alive and its GPUs healthy, apart from
the work it runs: heartbeats (each one the broker acknowledged renews the node's
workload lease), GPU faults reported as ``GpuHealthChanged``, and the node's status as
the log has it. ``NodeAgent`` (``agent.py``) has these; a node host's nodes
(``host.py``) send their heartbeats together instead."""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable

from gpusched.adapters.nodes.reports import beats_topic
from gpusched.adapters.service import every
from gpusched.core import events as ev
from gpusched.core.model import NodeStatus
from gpusched.v1 import events_pb2

log = logging.getLogger("gpusched.node_agent")


class NodeLiveness:
    """Part of ``NodeAgent``: reads its ``info``, ``publisher``, ``lease``, ``runs``,
    ``running``, ``settling``, ``follower`` and ``health``, and reports through its
    ``publish``."""

    settling = False   # an earlier life's workers not yet taken over or ended (the agent's join)
    _lapsed = False    # the lease ran out while workers ran: said once
    _lease_changed: asyncio.Event | None = None

    # --- GPU health -----------------------------------------------------------------
    async def watch_health(self, backend) -> None:
        await backend.start()
        while True:
            fault = await backend.faults.get()
            if not 0 <= fault.gpu_index < len(self.info.gpus):
                log.warning("fault on unknown GPU %s: %s", fault.gpu_index, fault.reason)
                continue
            self.health[fault.gpu_index] = fault.reason
            await self.publish(self._event(ev.GpuHealthChanged, node=self.name, gpu_index=fault.gpu_index,
                                           healthy=False, reason=fault.reason, xid=fault.xid))

    # --- liveness -------------------------------------------------------------------
    async def beat(self) -> bool:
        """Send one heartbeat; once the broker has it, the lease runs ``lease_s`` from
        when it was sent, which is no later than when the supervisor can have seen it."""
        sent = time.time()
        beat = events_pb2.Heartbeat(node=self.name, pool=self.info.pool, agent_id=self.info.agent_id,
                                    time=sent, running=[f"{j}/{a}/{w}" for j, a, w in self.running])
        try:
            await self.publisher.send_raw(beats_topic(self.publisher.topics.prefix, self.name),
                                          beat.SerializeToString(), key=self.name.encode())
        except Exception:
            log.warning("heartbeat not sent", exc_info=True)
            return False
        if self.lease is not None:
            if self.lease.expiry() <= sent and (self.settling or any(r.under_lease for r in self.runs.values())):
                # Ran out while work may still run under it: its shims are ending that
                # work, and a renewal now could keep one that has not looked yet going
                # past the bound the scheduler counts on (``fence_at``). It is renewed
                # once nothing runs under it any more.
                if not self._lapsed:
                    log.warning("the lease ran out at %.3f while workers ran: not renewed until they are gone",
                                self.lease.expiry())
                self._lapsed = True
                return True
            self._lapsed = False
            self.lease.renew(sent + self.info.lease_s)
            self.lease_changed.set()   # workers waiting for a valid lease may start
        return True

    @property
    def lease_changed(self) -> asyncio.Event:
        """Set when the lease was renewed or a worker waiting for it was told to stop."""
        if self._lease_changed is None:
            self._lease_changed = asyncio.Event()
        return self._lease_changed

    async def lease_held(self, stopped: Callable[[], bool]) -> None:
        """Return once the lease runs past now, or once ``stopped()`` (the worker waiting
        was told to stop): a worker starts only under a valid lease (its shim refuses it
        otherwise). A lease that ran out is renewed once no worker runs under it (``beat``)."""
        while self.lease is not None and self.lease.expiry() <= time.time() and not stopped():
            self.lease_changed.clear()
            await self.lease_changed.wait()

    async def heartbeats(self, interval: float, stop: asyncio.Event) -> None:
        await every(interval, stop, self.beat)

    def node_status(self) -> NodeStatus | None:
        for state in self.follower.states.values():
            node = state.nodes.get(self.name)
            if node is not None:
                return node.status
        return None
