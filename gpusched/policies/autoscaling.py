"""How many replicas a service should have for its load: the HorizontalPodAutoscaler's rule.

Pure: ``recommend`` reads the service as the log has it, what its ready replicas last
measured (``ReplicaLoad``, from the node-agents' usage records) and what this autoscaler
recommended before (``ScaleMemory``, kept by the preemptor per service between its
calls), and answers the count to ask for, or None to leave it be.

The rule, as Kubernetes' HPA (``autoscaling/v2``) has it:
1. **Proportional.** ``desired = ceil(ready x mean / target)``, the mean of the metric
   over the ready replicas that measured it. Within ``tolerance`` of the target
   (``|mean / target - 1| <= tolerance``) the count stays.
2. **Scale-down stabilization.** The count goes down only to the highest recommendation
   of the last ``scale_down_window_s``, so a dip does not stop replicas a peak needs
   again a minute later. A fresh memory (a new preemptor) counts the current count as
   recommended when it started, so a restart never shrinks a service early.
3. **Scale-up rate.** At most ``max_scale_up`` replicas more per minute.
4. **Bounds.** Within ``min_replicas..max_replicas``.
5. **Scale to zero.** With ``scale_to_zero_after_s``, a service whose replicas measured
   no request in flight and no new request for that long goes to zero. A request for it
   brings one replica back (the load balancer's activator, or ``gpusched scale``); the
   autoscaler never scales a service up from zero, having no replica to measure.

Replicas that are not ready are left out of the mean (they serve nothing yet), as the
HPA leaves out pods that are not ready; with no measurement at all nothing changes.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Mapping

from gpusched.core.model import ScalingMetric
from gpusched.core.state import ServiceState

RATE_WINDOW_S = 60.0   # ``max_scale_up`` counts replicas added within this long


@dataclass(frozen=True, slots=True)
class ReplicaLoad:
    """What one replica measured last: requests in flight, requests a second (-1: not
    measured) and its GPUs' mean SM utilization in percent (-1: not measured)."""

    time: float
    in_flight: float = -1.0
    per_second: float = -1.0
    gpu_percent: float = -1.0

    def value(self, metric: ScalingMetric) -> float:
        if metric is ScalingMetric.REQUESTS_IN_FLIGHT:
            return self.in_flight
        if metric is ScalingMetric.REQUESTS_PER_SECOND:
            return self.per_second
        return self.gpu_percent

    @property
    def idle(self) -> bool:
        return self.in_flight == 0 and self.per_second <= 0


@dataclass(slots=True)
class ScaleMemory:
    """What the autoscaler remembers of one service between calls."""

    since: float                                   # when this memory began
    recommended: deque = field(default_factory=deque)   # (time, count) within the window
    added: deque = field(default_factory=deque)    # (time, replicas added) within RATE_WINDOW_S
    busy_at: float = -math.inf                     # the latest measurement of any request


@dataclass(frozen=True, slots=True)
class Recommendation:
    replicas: int
    reason: str


def recommend(service: ServiceState, loads: Mapping[str, ReplicaLoad], memory: ScaleMemory,
              now: float, fresh_s: float = 30.0) -> Recommendation | None:
    """The count to ask for now, or None to leave the service be. ``loads``: the last
    measurement of each replica; older than ``fresh_s`` is not used."""
    spec, current = service.spec, service.desired
    rule = spec.autoscaling
    if rule.metric is ScalingMetric.NONE or current == 0:
        return None
    if not memory.recommended:
        memory.recommended.append((memory.since, current))
    seen = [loads[j] for j in service.ready if j in loads and now - loads[j].time <= fresh_s]
    if any(not load.idle for load in seen):
        memory.busy_at = now
    values = [v for v in (load.value(rule.metric) for load in seen) if v >= 0]
    if rule.scale_to_zero_after_s and seen and not spec.min_replicas \
            and now - max(memory.busy_at, memory.since, service.updated_at) >= rule.scale_to_zero_after_s:
        return Recommendation(0, f"autoscaler: no request for {rule.scale_to_zero_after_s:g}s")
    if not values:
        return None
    mean = sum(values) / len(values)
    ratio = mean / rule.target
    ready = len(values)
    if abs(ratio - 1.0) <= rule.tolerance:
        wanted = current
    else:
        wanted = math.ceil(ready * ratio - 1e-9)
    wanted = _bounded(spec.min_replicas or 1, spec.max_replicas, wanted)
    _remember(memory.recommended, now - rule.scale_down_window_s, (now, wanted))
    if wanted < current:
        wanted = min(current, max(count for _, count in memory.recommended))
    elif wanted > current:
        _forget_before(memory.added, now - RATE_WINDOW_S)
        room = rule.max_scale_up - sum(n for _, n in memory.added)
        wanted = current + max(0, min(wanted - current, room))
        if wanted > current:
            memory.added.append((now, wanted - current))
    if wanted == current:
        return None
    return Recommendation(wanted, f"autoscaler: {rule.metric.value} {mean:.3g} per replica over {ready}, "
                                  f"target {rule.target:g}")


def _bounded(low: int, high: int, count: int) -> int:
    count = max(low, count)
    return min(high, count) if high else count


def _remember(window: deque, oldest: float, entry: tuple[float, int]) -> None:
    _forget_before(window, oldest)
    window.append(entry)


def _forget_before(window: deque, oldest: float) -> None:
    while window and window[0][0] < oldest:
        window.popleft()
