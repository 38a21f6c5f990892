"""CPU time of the preemptor's rounds on a full pool, the code as it is against the code as
it was, alternated in one run.

A pool of N nodes with 8 GPUs each: GPU 0 of every node runs a ``production-inference``
job (no pending job's victim), the others one 1-GPU ``training`` job each (past its exempt
time, checkpointable). Waiting: one 8-GPU ``training-high`` job, which no victim set can
place (every node keeps its GPU 0), then P ``training-high`` 1-GPU jobs of a few CPU sizes
(so the placer is asked about several shapes). Timed per round (CPU seconds, after
``gc.freeze()`` as the services do once the state is read, and with the cyclic GC paused
for the round as the preemptor service runs it; ``--gc-on`` leaves it on):

* ``preemption_decisions`` (which stops after 8 decisions), with the victim search on the
  index of candidate victims against the full scan of the pool per decision
  (``tests/unit/policies/victim_search_oracle.py``): the first round, which builds the
  index, and then rounds after the changes a round brings (its decisions applied: victims
  preempted and requeued, beneficiaries nominated; 0.5 % of the running jobs checkpointed;
  the clock 5 s on), where the index kept from the round before, and the placer's views
  kept beside it (free capacity: ``placer_views``), are brought in step (best of
  ``--repeats`` such rounds);
* in those rounds, the CPU of one decision's search (``find``, its mean over the rounds)
  and of the search that finds no victims (the 8-GPU job's), less what is built once per
  round and shown apart: the index of candidate victims (built, or brought in step), the
  kept worker slots of each job shape (``SlotCounts``) and the teams' rankings;
* ``defrag_decisions`` (which looks at every pending job: none is blocked by
  fragmentation only, the pool being full), with the placer's views kept for the round
  against views built afresh per pending job (``tests/unit/policies/preemption_oracle.py``).

Both versions' decisions are checked to be equal.

    python bench/preemptor_bench.py --nodes 1000 5000 --pending 64 --repeats 3

``--node-event register``: the rounds after the first take turns: one after the changes a
round brings only, one after them and a node's agent registering again with the same
inventory (a rolling restart; node ``k`` the ``k``-th time), one after them and a new
node joining another pool (empty: the round's decisions stay those of the others);
``--repeats`` rounds of each, each kind its own rows.

``--defrag``: a fragmented pool instead, where defragmentation plans every round. N nodes
of 8 GPUs, each running three 1-GPU ``training`` jobs (GPUs 0, 3 and 6; checkpointable,
checkpointed lately, past their exempt time); waiting: P 8-GPU ``training`` jobs, which
no node has room for and no preemption serves (same class, no guarantees), though the
pool has the free GPUs. Rounds as the preemptor runs them: the preempt action, then
``defrag_decisions`` (timed), on one dict of kept views and one kept index where this code
takes them, then the changes a round brings (its plans carried out: moved jobs preempted
and requeued, beneficiaries nominated). Timed against the same round with views built for
it (``defrag_decisions`` without them); best of ``--repeats`` rounds after the first.

    python bench/preemptor_bench.py --defrag --nodes 1000 5000 --pending 64 --repeats 3
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
from gpusched.policies.memory import CycleMemory  # noqa: E402
from gpusched.policies.preemption.decisions import preemption_decisions, preemption_events  # noqa: E402
from gpusched.policies.preemption.defrag import defrag_decisions  # noqa: E402
from gpusched.policies.preemption.borrowing import TeamRanking  # noqa: E402
from gpusched.policies.preemption.victim_index import VictimIndex  # noqa: E402
from gpusched.policies.preemption.search_context import SearchContext  # noqa: E402
from gpusched.policies.preemption.victim_rules import PreemptionConfig  # noqa: E402
from tests.unit.policies import preemption_oracle as oracle  # noqa: E402
from tests.unit.policies import victim_search_oracle as scan  # noqa: E402

try:
    from gpusched.policies.preemption.slot_counts import SlotCounts  # noqa: E402
except ImportError:   # the code as it was before slot counts had a module of their own
    from gpusched.policies.preemption.victim_index import SlotCounts  # type: ignore[no-redef]  # noqa: E402

NOW = 10_000.0
# The search is timed where it decides: no bound on work lost for a wait, which the
# pending jobs here, waiting seconds, would never meet.
RULES = PreemptionConfig(max_loss_per_wait=float("inf"))


class Log:
    """Events applied to one state, numbered."""

    def __init__(self) -> None:
        self.state, self.n = ClusterState(), 0

    def put(self, cls, at: float, **kw) -> None:
        self.n += 1
        outcome = apply(self.state, cls(event_id=f"e{self.n}", time=at, **kw))
        assert outcome.accepted, outcome


def node_info(i: int, pool: str = "default") -> NodeInfo:
    """Node ``i`` of ``pool``, 8 H100s, as its agent registers it (a fresh object each time)."""
    name = f"n{i:05d}" if pool == "default" else f"{pool}-{i:05d}"
    gpus = tuple(GpuInfo(g, f"{name}-g{g}", "H100-80GB", 81_920) for g in range(8))
    return NodeInfo(name=name, pool=pool, cpu_milli=128_000, memory_mib=1_000_000, gpus=gpus)


def registered(nodes: int) -> Log:
    """A log of N 8-GPU nodes, registered."""
    log = Log()
    for i in range(nodes):
        log.put(ev.NodeRegistered, NOW - 3000, node=node_info(i))
    return log


# ``--node-event register``: what comes before a round after the first, in turn (row names).
NODE_EVENTS = ("kept", "registered again", "joined")


def node_event(log: Log, nodes: int, round_no: int, now: float) -> str:
    """Before round ``round_no`` (from 1): nothing, node ``k`` registering again as it was,
    or new node ``k`` joining the pool ``spare`` (``k``: the turn). The round's row."""
    kind = NODE_EVENTS[(round_no - 1) % len(NODE_EVENTS)]
    k = (round_no - 1) // len(NODE_EVENTS)
    if kind != "kept":
        info = node_info(k % nodes) if kind == "registered again" else node_info(k, "spare")
        log.put(ev.NodeRegistered, now, node=info)
    return kind


def run_on(log: Log, node: int, gpu: int, started: float, team: str, priority_class: str) -> str:
    """A 1-GPU job on GPU ``gpu`` of node ``node``, placed and started; its id."""
    job_id = f"r{node}-{gpu}"
    spec = JobSpec(name=job_id, team=team, priority_class=priority_class,
                   resources=WorkerResources(gpus=1, cpu_milli=4000), checkpoint_interval_s=300.0)
    log.put(ev.JobSubmitted, NOW - 2000, job_id=job_id, spec=spec)
    log.put(ev.JobPlaced, NOW - 2000, job_id=job_id, attempt=0,
            workers=(WorkerAssignment(0, f"n{node:05d}", (GpuSlot(gpu),)),))
    log.put(ev.WorkerStarted, started, job_id=job_id, attempt=0, worker=0, node=f"n{node:05d}")
    return job_id


def full_pool(nodes: int, pending: int) -> Log:
    log = registered(nodes)
    for i in range(nodes):
        for g in range(8):
            run_on(log, i, g, NOW - 1900 + (i * 8 + g) % 500, f"t{(i + g) % 5}",
                   "production-inference" if g == 0 else "training")
    wide = JobSpec(name="wide", team="t0", priority_class="training-high", resources=WorkerResources(gpus=8))
    log.put(ev.JobSubmitted, NOW - 11, job_id="wide", spec=wide)
    for k in range(pending):
        spec = JobSpec(name=f"p{k}", team=f"t{k % 5}", priority_class="training-high",
                       resources=WorkerResources(gpus=1, cpu_milli=1000 * (1 + k % 4)))
        log.put(ev.JobSubmitted, NOW - 10, job_id=f"p{k}", spec=spec)
    return log


def fragmented_pool(nodes: int, pending: int) -> Log:
    """Three 1-GPU jobs on every node (``--defrag``), P 8-GPU jobs of their class waiting."""
    log = registered(nodes)
    for i in range(nodes):
        for g in (0, 3, 6):
            job_id = run_on(log, i, g, NOW - 1900, "t0", "training")
            log.put(ev.CheckpointSaved, NOW - 1 - (i * 3 + g) % 400, job_id=job_id, attempt=0, checkpoint="c")
    for k in range(pending):
        spec = JobSpec(name=f"w{k}", team="t0", priority_class="training", resources=WorkerResources(gpus=8))
        log.put(ev.JobSubmitted, NOW - 10, job_id=f"w{k}", spec=spec)
    return log


def defrag_rounds(logs: dict[int, Log], repeats: int) -> None:
    """``--defrag``: defragmentation rounds on kept views against views built per round."""
    best: dict[tuple, float] = {}
    for n, log in logs.items():
        memory, now = CycleMemory(), NOW
        for r in range(repeats + 1):
            state = log.state
            assert not preemption_decisions(state, now, memory, RULES)   # nothing to preempt: defrag's turn
            t_is, got = cpu(lambda: defrag_decisions(state, now, memory))
            t_was, want = cpu(lambda: defrag_decisions(state, now, CycleMemory()))
            assert got == want and len(got) == 4, (n, r, got)
            for key, t in (((n, "first" if r == 0 else "kept", "is"), t_is), ((n, "fresh", "was"), t_was)):
                best[key] = min(best.get(key, float("inf")), t)
            now = a_round_later(log, got, now, r)
    print(f"cyclic GC paused in rounds: {GC_PAUSED}")
    print(f"{'nodes':>6} {'views built for the round ms':>29} {'first round ms':>15} {'a round later ms':>17} "
          f"{'ratio':>6}")
    for n in logs:
        fresh, first, later = best[n, "fresh", "was"], best[n, "first", "is"], best[n, "kept", "is"]
        print(f"{n:>6} {fresh * 1000:>29.2f} {first * 1000:>15.2f} {later * 1000:>17.2f} {fresh / later:>5.2f}x")


def a_round_later(log: Log, decisions, now: float, round_no: int) -> float:
    """What the log brings between two rounds: the decisions' preemptions (each victim's
    worker then finishes: requeued), checkpoints of 0.5 % of the running jobs; the clock 5 s on."""
    state = log.state
    for decision in decisions:
        for e in preemption_events(state, decision, now):
            log.put(type(e), now, **{f: getattr(e, f) for f in ("job_id", "attempt", "for_job", "reason",
                                                                  "planned_nodes")})
        for vid in decision.victims:
            victim = state.jobs[vid]
            for w in victim.workers:
                log.put(ev.WorkerFinished, now, job_id=vid, attempt=victim.attempt, worker=w.worker,
                        node=w.node, exit_code=0)
    running = [j for j in state.jobs.values() if j.phase.value == "running"]
    for job in running[round_no % 200::200]:
        log.put(ev.CheckpointSaved, now, job_id=job.job_id, attempt=job.attempt, checkpoint="c")
    return now + 5.0


# Whether rounds run with the cyclic GC paused, as the preemptor service runs them
# (``--gc-on``: not, as the service did before).
GC_PAUSED = True


def cpu(fn) -> tuple[float, object]:
    paused = GC_PAUSED and gc.isenabled()
    if paused:
        gc.disable()
    try:
        t0 = time.process_time()
        out = fn()
        return time.process_time() - t0, out
    finally:
        if paused:
            gc.enable()


class Timed:
    """CPU seconds spent in some methods while entered (wrapped on their classes, put back
    on exit). The first, ``find``: each call's seconds less those of the others inside it
    (``finds``: (seconds, found nothing)); the others: ``built``, their outermost calls' sum."""

    def __init__(self, find: tuple[type, str], *built: tuple[type, str]) -> None:
        self.methods = (find, *built)
        self.finds: list[tuple[float, bool]] = []
        self.built = 0.0
        self._nested = [0.0]   # per open find: built seconds inside it
        self._depth = 0        # open calls of built methods
        self._saved: dict[tuple[type, str], object] = {}

    def _wrap_find(self, inner):
        def timed(*a, **kw):
            t0 = time.process_time()
            self._nested.append(0.0)
            out = inner(*a, **kw)
            spent = time.process_time() - t0
            self.finds.append((spent - self._nested.pop(), out is None))
            return out
        return timed

    def _wrap_built(self, inner):
        def timed(*a, **kw):
            t0 = time.process_time()
            self._depth += 1
            try:
                return inner(*a, **kw)
            finally:
                self._depth -= 1
                if not self._depth:
                    spent = time.process_time() - t0
                    self.built += spent
                    self._nested[-1] += spent
        return timed

    def __enter__(self) -> "Timed":
        for i, key in enumerate(self.methods):
            cls, name = key
            self._saved[key] = cls.__dict__[name]
            setattr(cls, name, (self._wrap_built if i else self._wrap_find)(self._saved[key]))
        return self

    def __exit__(self, *exc) -> None:
        for (cls, name), inner in self._saved.items():
            setattr(cls, name, inner)

    def search(self, failed: bool) -> float | None:
        spent = [t for t, none in self.finds if none == failed]
        return sum(spent) / len(spent) if spent else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, nargs="+", default=[1000, 5000])
    p.add_argument("--pending", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--gc-on", action="store_true", help="time rounds with the cyclic GC on (the service pauses it)")
    p.add_argument("--node-event", choices=("register",), help="before rounds after the first, in turn: none, a "
                   "node registering again as it was, a new node joining another pool")
    p.add_argument("--defrag", action="store_true",
                   help="a fragmented pool: defragmentation rounds on kept views against views built per round")
    args = p.parse_args()
    global GC_PAUSED
    GC_PAUSED = not args.gc_on
    if args.defrag:
        logs = {n: fragmented_pool(n, args.pending) for n in args.nodes}
        gc.freeze()
        defrag_rounds(logs, args.repeats)
        return
    logs = {n: full_pool(n, args.pending) for n in args.nodes}
    gc.freeze()
    find_was, find_is = (scan.FrozenSearchContext, "find"), (SearchContext, "find")
    index_built = (VictimIndex, "refresh") if hasattr(VictimIndex, "refresh") else (VictimIndex, "__init__")
    built = [index_built, (SlotCounts, "__init__"), (SearchContext, "team_jobs"), (TeamRanking, "__init__")]
    best: dict[tuple, float] = {}

    def keep(key: tuple, value: float | None) -> None:
        if value is not None:
            best[key] = min(best.get(key, float("inf")), value)

    for n, log in logs.items():
        memory, now = CycleMemory(), NOW
        for r in range(args.repeats * (len(NODE_EVENTS) if args.node_event else 1) + 1):
            row = "first" if r == 0 else node_event(log, n, r, now) if args.node_event else "kept"
            state = log.state
            with Timed(find_was) as timed_was:
                t_was, want = cpu(lambda: scan.preemption_decisions(state, now, RULES))
            with Timed(find_is, *built) as timed_is:
                t_is, got = cpu(lambda: preemption_decisions(state, now, memory, RULES))
            assert got == want, (n, r)
            decided = got
            keep((n, row, "was"), t_was)
            keep((n, row, "is"), t_is)
            keep((n, row + " built", "is"), timed_is.built)
            for failed, label in ((False, "search"), (True, "none")):
                keep((n, label, "was"), timed_was.search(failed))
                keep((n, label, "is"), timed_is.search(failed))
            if r == 0:
                t_was, want = cpu(lambda: oracle.defrag_decisions(state, now))
                t_is, got = cpu(lambda: defrag_decisions(state, now, CycleMemory()))
                assert got == want, (n, "defrag")
                keep((n, "defrag", "was"), t_was)
                keep((n, "defrag", "is"), t_is)
            now = a_round_later(log, decided, now, r)
    print(f"cyclic GC paused in rounds: {GC_PAUSED}")
    print(f"{'nodes':>6} {'':>40} {'as it was ms':>13} {'as it is ms':>12} {'ratio':>7}")
    rounds = [("first", "preemption round, first"), ("kept", "preemption round, a round later")]
    if args.node_event:
        rounds += [(r, f"a round later, a node {r}") for r in NODE_EVENTS[1:]]
    rows = rounds + [("search", "one decision's search"), ("none", "a search that finds none"),
                     ("defrag", "defrag round")]
    for n in logs:
        for r, label in rows:
            was, now_is = best[n, r, "was"], best[n, r, "is"]
            print(f"{n:>6} {label:>40} {was * 1000:>13.2f} {now_is * 1000:>12.3f} {was / now_is:>6.1f}x")
        for r, _ in rounds:
            print(f"{n:>6} {'(built in the ' + r + ' round)':>40} {'':>13} {best[n, r + ' built', 'is'] * 1000:>12.2f}")


if __name__ == "__main__":
    main()
