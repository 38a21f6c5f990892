"""CPU time of one preemptor round on a full pool, the code as it is against the code as
it was, alternated in one run.

A pool of N nodes with 8 GPUs each runs one 1-GPU ``training`` job per GPU (past its
exempt time, checkpointable); P ``training-high`` 1-GPU jobs wait, of a few CPU sizes (so
the placer is asked about several shapes). Timed per round (CPU seconds, best of
``--repeats``, after ``gc.freeze()`` as the services do once the state is read):

* ``preemption_decisions`` (which stops after 8 decisions), with the victim search on the
  round's index against the full scan of the pool per decision
  (``tests/unit/policies/victim_search_oracle.py``); and, in the same runs, the CPU of one
  decision's search (``find``, its mean over the round), less what is built once per round
  inside the searches and shown apart: the index of candidate victims (``VictimIndex``),
  the kept worker slots of each job shape (``SlotCounts``) and the teams' sums
  (``SearchContext.team_jobs``, ``TeamRanking``);
* ``defrag_decisions`` (which looks at every pending job: none is blocked by
  fragmentation only, the pool being full), with the placer's views kept for the round
  against views built afresh per pending job (``tests/unit/policies/preemption_oracle.py``).

Both versions' decisions are checked to be equal.

    python bench/preemptor_bench.py --nodes 1000 5000 --pending 64 --repeats 3
"""
from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpusched.core import events as ev  # noqa: E402
from gpusched.core.model import GpuInfo, GpuSlot, JobSpec, NodeInfo, WorkerAssignment, WorkerResources  # noqa: E402
from gpusched.core.reducer import apply  # noqa: E402
from gpusched.core.state import ClusterState  # noqa: E402
from gpusched.policies.preemption.decisions import preemption_decisions  # noqa: E402
from gpusched.policies.preemption.defrag import defrag_decisions  # noqa: E402
from gpusched.policies.preemption.borrowing import TeamRanking  # noqa: E402
from gpusched.policies.preemption.victim_index import SlotCounts, VictimIndex  # noqa: E402
from gpusched.policies.preemption.victim_rules import SearchContext  # noqa: E402
from tests.unit.policies import preemption_oracle as oracle  # noqa: E402
from tests.unit.policies import victim_search_oracle as scan  # noqa: E402

NOW = 10_000.0


def full_pool(nodes: int, pending: int) -> ClusterState:
    state = ClusterState()
    n = 0

    def put(cls, at: float, **kw) -> None:
        nonlocal n
        n += 1
        outcome = apply(state, cls(event_id=f"e{n}", time=at, **kw))
        assert outcome.accepted, outcome

    for i in range(nodes):
        gpus = tuple(GpuInfo(g, f"n{i}-g{g}", "H100-80GB", 81_920) for g in range(8))
        put(ev.NodeRegistered, NOW - 3000, node=NodeInfo(
            name=f"n{i:05d}", pool="default", cpu_milli=128_000, memory_mib=1_000_000, gpus=gpus))
    for i in range(nodes):
        for g in range(8):
            job_id = f"r{i}-{g}"
            spec = JobSpec(name=job_id, team=f"t{(i + g) % 5}", priority_class="training",
                           resources=WorkerResources(gpus=1, cpu_milli=4000), checkpoint_interval_s=300.0)
            put(ev.JobSubmitted, NOW - 2000, job_id=job_id, spec=spec)
            put(ev.JobPlaced, NOW - 2000, job_id=job_id, attempt=0,
                workers=(WorkerAssignment(0, f"n{i:05d}", (GpuSlot(g),)),))
            put(ev.WorkerStarted, NOW - 1900 + (i * 8 + g) % 500, job_id=job_id, attempt=0, worker=0,
                node=f"n{i:05d}")
    for k in range(pending):
        spec = JobSpec(name=f"p{k}", team=f"t{k % 5}", priority_class="training-high",
                       resources=WorkerResources(gpus=1, cpu_milli=1000 * (1 + k % 4)))
        put(ev.JobSubmitted, NOW - 10, job_id=f"p{k}", spec=spec)
    return state


def cpu(fn) -> tuple[float, object]:
    t0 = time.process_time()
    out = fn()
    return time.process_time() - t0, out


class Timed:
    """CPU seconds and calls spent in some methods while entered (wrapped on their
    classes, put back on exit); ``nested``: the seconds of the others spent inside the
    first."""

    def __init__(self, *methods: tuple[type, str]) -> None:
        self.methods = methods
        self.spent = {m: 0.0 for m in methods}
        self.calls = {m: 0 for m in methods}
        self.nested = 0.0
        self._inside = 0
        self._saved: dict[tuple[type, str], object] = {}

    def _wrap(self, key: tuple[type, str], inner):
        outer = key == self.methods[0]

        def timed(*a, **kw):
            t0 = time.process_time()
            self._inside += outer
            try:
                return inner(*a, **kw)
            finally:
                self._inside -= outer
                spent = time.process_time() - t0
                self.spent[key] += spent
                self.calls[key] += 1
                if not outer and self._inside:
                    self.nested += spent
        return timed

    def __enter__(self) -> "Timed":
        for key in self.methods:
            cls, name = key
            self._saved[key] = cls.__dict__[name]
            setattr(cls, name, self._wrap(key, self._saved[key]))
        return self

    def __exit__(self, *exc) -> None:
        for (cls, name), inner in self._saved.items():
            setattr(cls, name, inner)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, nargs="+", default=[1000, 5000])
    p.add_argument("--pending", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    pools = {n: full_pool(n, args.pending) for n in args.nodes}
    gc.freeze()
    find_was, find_is = (scan.FrozenSearchContext, "find"), (SearchContext, "find")
    built = [(VictimIndex, "__init__"), (SlotCounts, "__init__"), (SearchContext, "team_jobs"),
             (TeamRanking, "__init__")]
    # round -> (as it was, as it is)
    rounds = {"preemption": (lambda s: scan.preemption_decisions(s, NOW), lambda s: preemption_decisions(s, NOW)),
              "defrag": (lambda s: oracle.defrag_decisions(s, NOW), lambda s: defrag_decisions(s, NOW))}
    best: dict[tuple, float] = {}

    def keep(key: tuple, value: float) -> None:
        best[key] = min(best.get(key, float("inf")), value)

    for _ in range(args.repeats):
        for n, state in pools.items():
            for r, (was, now) in rounds.items():
                with Timed(find_was) as timed_was:
                    t_was, want = cpu(lambda: was(state))
                with Timed(find_is, *built) as timed_is:
                    t_is, got = cpu(lambda: now(state))
                assert got == want, (n, r)
                keep((n, r, "was"), t_was)
                keep((n, r, "is"), t_is)
                if r == "preemption":
                    keep((n, "search", "was"), timed_was.spent[find_was] / max(1, timed_was.calls[find_was]))
                    keep((n, "search", "is"), (timed_is.spent[find_is] - timed_is.nested)
                         / max(1, timed_is.calls[find_is]))
                    keep((n, "built", "is"), sum(timed_is.spent[m] for m in built))
    print(f"{'nodes':>6} {'':>28} {'as it was ms':>13} {'as it is ms':>12} {'ratio':>7}")
    rows = [("preemption", "preemption round"), ("search", "one decision's search"), ("defrag", "defrag round")]
    for n in pools:
        for r, label in rows:
            was, now = best[n, r, "was"], best[n, r, "is"]
            print(f"{n:>6} {label:>28} {was * 1000:>13.2f} {now * 1000:>12.2f} {was / now:>6.1f}x")
        print(f"{n:>6} {'(built once a round)':>28} {'':>13} {best[n, 'built', 'is'] * 1000:>12.2f}")


if __name__ == "__main__":
    main()
