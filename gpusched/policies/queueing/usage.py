"""Each team's recent usage, decayed with a half-life: the memory of fair share.

Fair share charges a team for what it held lately, not only for what it holds now, so a
team that just finished a large burst waits behind teams that did not. The ledger keeps
an exponentially decayed average of each team's usage (GPU milli, CPU milli, memory):
a team that held ``u`` for a long time and then nothing is charged ``u/2`` one half-life
later. Time enters only through the ``now`` the scheduler passes in; the reducer never
sees the ledger, so decay costs nothing on the log's hot path.

The ledger is log state: the reducer keeps each team's decayed usage as of the last change
of its usage (``ClusterState.ledger``, settled by ``capacity.settle_ledger`` with event
times only), and ``folded_decay`` decays it to the scheduler's ``now``. Every replica, and
a placer that takes over a partition (from offset 0 or a snapshot), orders the queue as
the one before it did. ``UsageLedger`` is the same decay kept by a caller over the states
it is shown, for tools that have no log.
"""
from __future__ import annotations

from dataclasses import dataclass

from gpusched.core.state import ClusterState, Usage


@dataclass(frozen=True, slots=True)
class Demand:
    """An amount of the three resources DRF compares."""

    gpu_milli: float = 0.0
    cpu_milli: float = 0.0
    memory_mib: float = 0.0

    @classmethod
    def of_usage(cls, usage: Usage) -> Demand:
        return cls(usage.gpu_milli, usage.cpu_milli, usage.memory_mib)

    def __add__(self, other: Demand) -> Demand:
        return Demand(self.gpu_milli + other.gpu_milli, self.cpu_milli + other.cpu_milli,
                      self.memory_mib + other.memory_mib)

    def max(self, other: Demand) -> Demand:
        return Demand(max(self.gpu_milli, other.gpu_milli), max(self.cpu_milli, other.cpu_milli),
                      max(self.memory_mib, other.memory_mib))

    def toward(self, target: Demand, keep: float) -> Demand:
        """``target + (self - target) * keep``: one decay step toward ``target``."""
        return Demand(target.gpu_milli + (self.gpu_milli - target.gpu_milli) * keep,
                      target.cpu_milli + (self.cpu_milli - target.cpu_milli) * keep,
                      target.memory_mib + (self.memory_mib - target.memory_mib) * keep)


ZERO = Demand()
# Below this (in every resource) a team's decayed usage is forgotten, to keep the ledger small.
_NEGLIGIBLE = 1e-3


def folded_decay(state: ClusterState, now: float) -> dict[str, Demand]:
    """Each team's decayed usage at ``now`` from the folded ledger: its entry decayed
    from the entry's log time toward what the team holds (held since, unchanged)."""
    half_life = state.ledger_half_life_s
    usage = state.usage
    out: dict[str, Demand] = {}
    for team, entry in state.ledger.items():
        u = usage.get(team)
        g, c, m = (u.gpu_milli, u.cpu_milli, u.memory_mib) if u is not None else (0, 0, 0)
        elapsed = now - entry.at
        keep = 1.0 if elapsed <= 0.0 else (0.5 ** (elapsed / half_life) if half_life > 0.0 else 0.0)
        d = Demand(g + (entry.gpu_milli - g) * keep, c + (entry.cpu_milli - c) * keep,
                   m + (entry.memory_mib - m) * keep)
        if max(d.gpu_milli, d.cpu_milli, d.memory_mib) > _NEGLIGIBLE:
            out[team] = d
    return out


class UsageLedger:
    def __init__(self, half_life_s: float) -> None:
        if half_life_s < 0:
            raise ValueError("half_life_s must be >= 0")
        self.half_life_s = half_life_s
        self._average: dict[str, Demand] = {}
        self._held: dict[str, Demand] = {}    # usage seen at the last advance, held since
        self._at: float | None = None

    def advance(self, state: ClusterState, now: float) -> None:
        """Decay the averages over ``[last advance, now]``, during which each team held what
        it held at the last advance (exact when called at every change, as the simulator
        does), then take the current usage as what is held from now on."""
        current = {t: Demand.of_usage(u) for t, u in state.usage.items()
                   if u.gpu_milli or u.cpu_milli or u.memory_mib}
        if self._at is None or not self.half_life_s:
            # No past known (a fresh replica) or none wanted: start from what is held now.
            self._average = dict(current)
        elif now > self._at:
            keep = 0.5 ** ((now - self._at) / self.half_life_s)
            for team in set(self._average) | set(self._held):
                self._average[team] = self._average.get(team, ZERO).toward(self._held.get(team, ZERO), keep)
            self._average = {t: a for t, a in self._average.items()
                             if max(a.gpu_milli, a.cpu_milli, a.memory_mib) > _NEGLIGIBLE}
        self._held = current
        self._at = now if self._at is None else max(self._at, now)

    def decayed(self) -> dict[str, Demand]:
        return dict(self._average)
