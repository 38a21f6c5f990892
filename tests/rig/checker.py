"""What a run under faults must have kept, from the workloads' own records
(tests/workloads/recorder.py, read by intervals.py) and the log (logcheck.py), and
how quickly it recovered.

Invariants (``Report.violations``):

* no acknowledged submission lost: every job the API acknowledged is known at the end;
* every acknowledged job reached a final state (the run waits for them after the last
  heal, so "ran after the faults healed" is covered by reaching one);
* no GPU used by two processes at once (``overlaps``);
* no job ran twice at once: neither two attempts (``attempts_overlap``) nor two copies
  of one attempt's worker;
* the log's own checks (``check_log``: capacity, reports);
* the replicas agree (``disagreements``): every snapshot the placer wrote of the state it
  folded live through the faults (restarts from earlier snapshots included) has the digest
  of a fresh replay of the log up to the offset it covers, and admission's read model ends
  with every job in the phase the replay ends with.

Figures: faults by kind; per fault, the time from its heal to the first placement
after it, and the jobs placed again (attempt > 0) between its start and the next
fault's start; the GPU-hours the faults cost (work done and not kept by a checkpoint).
"""
from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from gpusched.adapters.log import codec
from gpusched.adapters.log.restore import decode_state
from gpusched.core import events as ev
from gpusched.core.digest import digest
from gpusched.core.reducer import apply
from gpusched.core.state import ClusterState
from tests.integration.cluster_calls import events_of
from tests.integration.logcheck import check_log
from tests.rig.nemesis import Fault
from tests.workloads.intervals import (Interval, attempts_overlap, lost_gpu_seconds, overlaps, read_records,
                                      with_shim_ends)

FINAL_OK = {"SUCCEEDED"}


@dataclass
class Report:
    acked: int = 0
    lost: list[str] = field(default_factory=list)
    unfinished: list[str] = field(default_factory=list)
    not_succeeded: dict[str, str] = field(default_factory=dict)
    gpu_overlaps: list = field(default_factory=list)
    attempt_overlaps: list = field(default_factory=list)
    double_runs: list = field(default_factory=list)
    log_violations: list[str] = field(default_factory=list)
    snapshots_checked: int = 0
    gpu_hours_lost: float = 0.0
    disagreements: list[str] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    recovery_s: list[float] = field(default_factory=list)      # per healed fault with a placement after it
    requeues: list[int] = field(default_factory=list)          # per fault
    intervals: int = 0
    trails: dict[str, list[str]] = field(default_factory=dict)  # unfinished job -> its events in the log

    @property
    def violations(self) -> list[str]:
        out = []
        if self.lost:
            out.append(f"{len(self.lost)} acknowledged job(s) lost: {self.lost[:5]}")
        if self.unfinished:
            out.append(f"{len(self.unfinished)} job(s) never reached a final state: "
                       + "; ".join(f"{j}: {' > '.join(self.trails.get(j, []))}" for j in self.unfinished[:3]))
        if self.gpu_overlaps:
            out.append(f"{len(self.gpu_overlaps)} GPU overlap(s): {self.gpu_overlaps[:3]}")
        if self.attempt_overlaps:
            out.append(f"{len(self.attempt_overlaps)} overlapping attempt(s): {self.attempt_overlaps[:3]}")
        if self.double_runs:
            out.append(f"{len(self.double_runs)} double run(s) of one attempt: {self.double_runs[:3]}")
        out += [f"log: {v}" for v in self.log_violations]
        out += [f"replicas disagree: {d}" for d in self.disagreements]
        return out

    def figures(self) -> str:
        kinds = Counter(f.kind for f in self.faults)
        rec = sorted(self.recovery_s)
        lines = [f"faults: {len(self.faults)} ({', '.join(f'{k} {n}' for k, n in sorted(kinds.items()))})",
                 f"acknowledged jobs: {self.acked}, lost {len(self.lost)}, unfinished {len(self.unfinished)}, "
                 f"not succeeded {len(self.not_succeeded)}",
                 f"worker runs recorded: {self.intervals}; GPU overlaps {len(self.gpu_overlaps)}, "
                 f"attempt overlaps {len(self.attempt_overlaps)}, double runs {len(self.double_runs)}",
                 f"log violations: {len(self.log_violations)}",
                 f"GPU-hours lost (run and not kept by a checkpoint): {self.gpu_hours_lost:.3f}",
                 f"replicas: {self.snapshots_checked} placer snapshots checked against a replay, "
                 f"{len(self.disagreements)} disagreement(s)"]
        if rec:
            lines.append(f"heal -> first placement: p50 {_pct(rec, 50):.2f}s p99 {_pct(rec, 99):.2f}s "
                         f"max {rec[-1]:.2f}s (n={len(rec)})")
        if self.requeues:
            lines.append(f"jobs placed again per fault: mean {statistics.mean(self.requeues):.2f}, "
                         f"max {max(self.requeues)}")
        for kind in sorted(kinds):
            rec_k = sorted(r for f, r in zip(self.faults, self._recovery_of) if f.kind == kind and r is not None)
            req_k = [q for f, q in zip(self.faults, self.requeues) if f.kind == kind]
            lines.append(f"  {kind:<16} x{kinds[kind]}: heal -> placement p50 "
                         + (f"{_pct(rec_k, 50):.2f}s" if rec_k else "-")
                         + f", placed again {sum(req_k)} in all")
        lines += [f"  {f}  recovery {r}" for f, r in zip(self.faults, self._per_fault_text)]
        return "\n".join(lines)

    _per_fault_text: list[str] = field(default_factory=list)
    _recovery_of: list[float | None] = field(default_factory=list)   # per fault, None: no placement after


def _pct(sorted_values: list[float], p: float) -> float:
    k = (len(sorted_values) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


def _brief(e: ev.Event, faults: list[Fault]) -> str:
    """An event in a few words, with its time relative to the first fault."""
    t0 = faults[0].start if faults else 0.0
    what = [type(e).__name__, f"t{e.time - t0:+.1f}"]
    for name in ("attempt", "node", "worker", "exit_code", "reason"):
        value = getattr(e, name, None)
        if value not in (None, ""):
            what.append(f"{name}={value}")
    if isinstance(e, ev.JobPlaced):
        what.append("on " + ",".join(w.node for w in e.workers))
    return " ".join(what)


def double_runs(intervals: list[Interval]) -> list[tuple]:
    """Two processes of the same (job, attempt, worker) alive at once."""
    by: dict[tuple, list[Interval]] = {}
    for i in intervals:
        by.setdefault((i.job, i.attempt, i.worker), []).append(i)
    found = []
    for key, runs in by.items():
        starts = sorted({(r.start, r.last_seen) for r in runs})   # one per process (a run per GPU)
        for (s1, e1), (s2, e2) in zip(starts, starts[1:]):
            if s2 < e1:
                found.append((key, (s1, e1), (s2, e2)))
    return found


def disagreements(log: dict, snapshots: dict, final: dict[str, str]) -> tuple[int, list[str]]:
    """(snapshots compared, disagreements) between a replay of ``log`` (partition ->
    [(offset, value)]), the snapshots (partition -> [(offset, value)], each a state
    covering some events offset) and ``final`` (job id -> phase name, as the API lists)."""
    found: list[str] = []
    compared = 0
    replayed: dict[str, str] = {}
    for partition, records in log.items():
        taken = sorted((s.offset, n, s) for n, s in enumerate(
            decode_state(value) for _, value in snapshots.get(partition, []) if value))
        state = ClusterState()
        pending = [(offset, s) for offset, _, s in taken]
        for offset, value in records:
            try:
                event, _ = codec.decode(value)
            except codec.DecodeError:
                event = None
            if event is not None:
                apply(state, event)
            state.offset = offset
            while pending and pending[0][0] == offset:
                compared += 1
                if digest(pending.pop(0)[1]) != digest(state):
                    found.append(f"partition {partition}: the snapshot at offset {offset} differs from a replay")
        found += [f"partition {partition}: a snapshot at offset {o} beyond the log" for o, _ in pending]
        replayed.update({jid: j.phase.value.upper() for jid, j in state.jobs.items()})
    for jid, phase in sorted(final.items()):
        if replayed.get(jid) != phase:
            found.append(f"{jid}: admission lists {phase}, a replay of the log {replayed.get(jid)}")
    return compared, found


def check(acked: set[str], final: dict[str, str], state_root: Path, log: dict, faults: list[Fault],
          snapshots: dict | None = None) -> Report:
    """``acked``: job ids the API acknowledged; ``final``: job id -> phase name of every job
    listed at the end; ``log``: ``read_log``'s; ``faults``: the nemesis's; ``snapshots``:
    ``read_log``'s of the snapshots topic."""
    r = Report(acked=len(acked), faults=list(faults))
    r.lost = sorted(acked - set(final))
    terminal = {"SUCCEEDED", "FAILED", "CANCELLED", "TIMEOUT"}
    r.unfinished = sorted(j for j in acked & set(final) if final[j] not in terminal)
    r.not_succeeded = {j: final[j] for j in acked & set(final) if final[j] in terminal - FINAL_OK}
    for e in events_of(log):
        job = getattr(e, "job_id", None)
        if job in r.unfinished:
            r.trails.setdefault(job, [f"(phase {final[job]})"]).append(_brief(e, faults))
    intervals = with_shim_ends(state_root, read_records(state_root))
    r.intervals = len(intervals)
    r.gpu_hours_lost = lost_gpu_seconds(state_root) / 3600
    r.gpu_overlaps = overlaps(intervals)
    r.attempt_overlaps = attempts_overlap(intervals)
    r.double_runs = double_runs(intervals)
    r.log_violations = list(check_log(log).violations)
    r.snapshots_checked, r.disagreements = disagreements(log, snapshots or {}, final)
    placed = sorted((e.time, e.attempt) for e in events_of(log) if isinstance(e, ev.JobPlaced))
    for n, f in enumerate(faults):
        until = faults[n + 1].start if n + 1 < len(faults) else float("inf")
        r.requeues.append(sum(1 for t, attempt in placed if f.start <= t < until and attempt > 0))
        after = [t - f.healed for t, _ in placed if f.healed and t >= f.healed]
        r._recovery_of.append(after[0] if after else None)
        if after:
            r.recovery_s.append(after[0])
            r._per_fault_text.append(f"{after[0]:.2f}s, {r.requeues[-1]} placed again")
        else:
            r._per_fault_text.append(f"no placement after, {r.requeues[-1]} placed again")
    return r
