"""How little waste the static packing benchmark allows: lower bounds on the unallocated
GPU capacity that ANY placement policy leaves at 130 % arrived, if it places every task
some node can take (the benchmark's rule: placed on arrival or failed, never refused to
keep room, never moved), for the same arrival sequence.

Both bounds turn on the *jam*: the first arrival at which no GPU has ``JAM`` (810, the
trace's largest share) milli free.

* **Before the jam every share is forced.** Some GPU has 810 free, so any share up to
  810 fits it (GPUs only: this assumes no such share is refused for want of CPU, memory
  or model on every node with such a GPU; shares with a model constraint are never
  counted as forced, and the trace's 810s ask 3 to 4 cores of nodes with 8 to 13 per
  GPU). The jam cannot come before the arrivals' *GPU touches* (1 per share, ``k`` per
  ``k``-GPU task) reach the cluster's GPU count.
* **After the jam little fits.** No whole GPU and no 810 can be placed any more, only
  smaller shares: the run ends with at most what arrived before the jam plus those.

Counting bound (this module, no solver): a large share (``> 500``) sits alone on its GPU
and leaves ``1000 - s`` that only a share of at most that size fills; the forced holes,
less the most the run's shares could fill of them (split freely, smallest holes first:
optimal, as a share that fits a small hole fits every larger one), bound the waste of a
late jam; what arrives before an early jam, plus the shares below 810 after it, bound
the allocation of an early one. The first grows with the jam's arrival, the second
shrinks, so the least of their larger is where they cross (bisection).
LP bound (below, scipy): every GPU holding shares is charged for what it leaves
free, with the shares' real sizes, and whole GPUs and the GPU count are in the same
program; tighter by 0.5 to 1 point.

    python -m gpusched.sim.packing_bound --lists all --seeds 10     # ~20 min on 2 processes
    python -m gpusched.sim.packing_bound --no-lp                     # the counting bound, seconds
"""
from __future__ import annotations

import argparse
import heapq
import sys
from dataclasses import dataclass
from multiprocessing import Pool
from statistics import mean

import numpy as np

from gpusched.sim.static import SEEDS, workload
from gpusched.sim.traces import POD_LISTS, TRACE_DIR, Task, load_nodes, load_tasks

LARGE = 500     # shares above this many milli never share a GPU with each other
JAM = 810       # the trace's largest share: the cluster jams when no GPU has this much free


@dataclass(frozen=True, slots=True)
class Bound:
    pod_list: str
    seed: int
    gpus: int                 # the cluster's GPUs
    forced: dict[int, int]    # large share size -> how many a never-refusing policy must place
    holes_milli: int          # the holes they leave
    fill_milli: float         # the most other shares can fill of them
    jam_milli: float          # what the run leaves free at the least if the jam comes sooner
    jam_at: float             # share of the arrivals offered before the jam, at the bound

    @property
    def waste(self) -> float:
        """Lower bound on the unallocated share of the cluster's GPU capacity."""
        return max(0.0, self.holes_milli - self.fill_milli, self.jam_milli) / (self.gpus * 1000)


def touches(task: Task) -> int:
    """Fully free GPUs the task can take at most."""
    res = task.resources
    return 1 if res.is_share else res.gpus


def is_large(task: Task) -> bool:
    res = task.resources
    return res.is_share and LARGE < res.gpu_milli <= JAM and not res.gpu_models


def most_fill(holes: dict[int, int], fillers: list[int]) -> float:
    """The most milli of ``fillers`` (share sizes, splittable, each piece only into a hole
    at least the share's size) that fit ``holes`` (hole size -> count)."""
    fillers = sorted(fillers)
    filled, used = 0.0, 0
    left_of_current = 0.0        # unfilled remainder of the filler at ``used - 1``
    for size in sorted(holes):
        room = float(size * holes[size])
        take = min(room, left_of_current)
        room -= take
        filled += take
        left_of_current -= take
        while room > 0 and used < len(fillers) and fillers[used] <= size:
            take = min(room, fillers[used])
            room -= take
            filled += take
            left_of_current = fillers[used] - take
            used += 1
    return filled


class Sequence:
    """The two sides of the bound for a jam before arrival ``i``, from prefix sums."""

    def __init__(self, arrivals: list[Task], gpus: int) -> None:
        self.arrivals, self.gpus = arrivals, gpus
        self.fillers = sorted(t.resources.gpu_milli for t in arrivals
                              if t.resources.is_share and t.resources.gpu_milli <= 1000 - LARGE)
        n = len(arrivals)
        self.request = [0] * (n + 1)      # GPU milli offered before i
        self.touched = [0] * (n + 1)      # fully free GPUs taken before i, at most
        self.late = [0] * (n + 1)         # milli of shares below JAM offered from i on
        for i, t in enumerate(arrivals):
            self.request[i + 1] = self.request[i] + t.gpu_milli
            self.touched[i + 1] = self.touched[i] + touches(t)
        for i in range(n - 1, -1, -1):
            res = arrivals[i].resources
            self.late[i] = self.late[i + 1] + (res.gpu_milli if res.is_share and res.gpu_milli < JAM else 0)

    def forced(self, i: int) -> dict[int, int]:
        counts: dict[int, int] = {}
        for t in self.arrivals[:i]:
            if is_large(t):
                counts[t.resources.gpu_milli] = counts.get(t.resources.gpu_milli, 0) + 1
        return counts

    def holes_left(self, i: int) -> tuple[int, float]:
        """(holes of the large shares forced before i, the most the others fill of them)."""
        holes: dict[int, int] = {}
        for size, n in self.forced(i).items():
            holes[1000 - size] = holes.get(1000 - size, 0) + n
        return sum(h * n for h, n in holes.items()), most_fill(holes, self.fillers)

    def jam_waste(self, i: int) -> float:
        """Free milli at the end, at the least, if no GPU has JAM milli free from arrival
        i on: nothing whole or as large as JAM is placed any more, so at most what came
        before i and the smaller shares after it were placed."""
        return self.gpus * 1000 - self.request[i] - self.late[i]


def bound(pod_list: str, seed: int, tasks: list[Task], gpus: int) -> Bound:
    """The least waste over every arrival at which the cluster may jam: before it, every
    large share is forced; after it, only shares below JAM can still be placed. The
    first side grows with the jam's arrival, the second shrinks, so the least of their
    larger is where they cross (found by bisection)."""
    seq = Sequence(workload(tasks, gpus * 1000, seed), gpus)
    n = len(seq.arrivals)
    first = next((i for i in range(n + 1) if seq.touched[i] >= gpus), n)   # no jam sooner

    def side(i: int) -> float:
        holes, fill = seq.holes_left(i)
        return holes - fill

    lo, hi = first, n          # the first i whose forced side reaches its jam side
    while lo < hi:
        mid = (lo + hi) // 2
        if side(mid) >= seq.jam_waste(mid):
            hi = mid
        else:
            lo = mid + 1
    best = lo if lo == first or side(lo) <= seq.jam_waste(lo - 1) else lo - 1
    holes, fill = seq.holes_left(best)
    return Bound(pod_list, seed, gpus, seq.forced(best), holes, fill,
                 seq.jam_waste(best) if best < n else 0.0, best / n)



# The LP bound: a linear program over how the run's GPU shares can be packed.
#
# The counting bound charges only the holes beside the large shares. This one charges every
# GPU that holds shares for what it leaves free, with the shares' real sizes: for a jam at
# arrival ``i`` (the first arrival at which no GPU has ``JAM`` milli free; ``n`` if none
# comes), every final state of any never-refusing policy is a solution of
#
#     minimise   1000 G - sum_c L_c x_c - 1000 w                (the milli left free)
#     subject to f_s <= sum_c a_sc x_c <= u_s    for every share size s
#                sum_c x_c + w <= G               (= G when the jam comes: every GPU then
#                                                  holds more than 1000 - JAM)
#                0 <= w <= W(i)
#
# where a *pattern* c is a set of shares that fits one GPU (``a_sc`` shares of size s,
# load ``L_c <= 1000``), ``x_c`` the GPUs packed so, ``w`` the GPUs given whole, ``f_s``
# the unconstrained shares of size s offered before the jam (forced: a GPU with ``JAM``
# free takes any of them), ``u_s`` those that can be placed at all (all offered before
# the jam; after it only those below ``JAM``), ``W(i)`` the whole GPUs offered before the
# jam (after it none fits) and G the cluster's GPUs. Its optimum (the patterns generated
# as needed, by a knapsack over 0..1000 milli) is a lower bound of the waste for that jam.
#
# The jam's arrival is unknown, so the bound is the least over all of them: intervals of
# arrivals are bounded at once (the fewest forced shares of the interval's start, the most
# whole GPUs and shares of its end: a relaxation of every jam inside), and the interval
# with the least bound is split until ``splits`` are spent. Needs scipy (HiGHS).

INFEASIBLE = float("inf")
_PENALTY = 1e7        # milli per GPU beyond the cluster's, to start from singleton patterns


@dataclass(frozen=True, slots=True)
class Problem:
    gpus: int
    forced: dict[int, int]     # share size -> shares that must be placed
    most: dict[int, int]       # share size -> shares that can be placed at most
    whole: int                 # whole GPUs that can be given at most
    jammed: bool               # every GPU holds something at the end


def best_pattern(sizes: list[int], value: np.ndarray) -> tuple[float, list[int]]:
    """The pattern (shares per size, fitting 1000 milli) of the greatest total ``value``."""
    best = np.zeros(1001)
    pick = np.full(1001, -1)
    for cap in range(1, 1001):
        best[cap], pick[cap] = best[cap - 1], -1
        for k, size in enumerate(sizes):
            if size <= cap and value[k] > 0 and best[cap - size] + value[k] > best[cap]:
                best[cap], pick[cap] = best[cap - size] + value[k], k
    counts, cap = [0] * len(sizes), 1000
    while cap > 0:
        if pick[cap] < 0:
            cap -= 1
        else:
            counts[pick[cap]] += 1
            cap -= sizes[pick[cap]]
    return float(best[1000]), counts


def least_waste(p: Problem) -> float:
    """The LP's optimum in milli (INFEASIBLE if no final state has this jam)."""
    from scipy.optimize import linprog    # only the bound needs scipy

    sizes = sorted(set(p.forced) | set(p.most))
    k = len(sizes)
    size = np.array(sizes, dtype=float)
    low = np.array([p.forced.get(s, 0) for s in sizes], dtype=float)
    high = np.array([p.most.get(s, 0) for s in sizes], dtype=float)
    patterns = [np.eye(k)[j] for j in range(k)]
    while True:
        a = np.array(patterns).T                                  # sizes x patterns
        m = a.shape[1]
        # columns: patterns, w, excess GPUs (penalised)
        cost = np.concatenate([-(size @ a), [-1000.0, _PENALTY]])
        ones = np.concatenate([np.ones(m), [1.0, -1.0]])
        rows = [np.hstack([-a, np.zeros((k, 2))]), np.hstack([a, np.zeros((k, 2))]), ones[None, :]]
        bounds_ub = [-low, high, [p.gpus]]
        if p.jammed:
            rows.append(-ones[None, :])
            bounds_ub.append([-p.gpus])
        res = linprog(cost, A_ub=np.vstack(rows), b_ub=np.concatenate(bounds_ub),
                      bounds=[(0, None)] * m + [(0, p.whole), (0, None)], method="highs")
        if res.status == 2:
            return INFEASIBLE
        if res.status != 0:
            raise RuntimeError(f"the packing LP failed: {res.message}")
        marg = res.ineqlin.marginals
        price = -marg[:k] + marg[k:2 * k]
        threshold = -marg[2 * k] + (marg[2 * k + 1] if p.jammed else 0.0)
        value, counts = best_pattern(sizes, size + price)
        if value <= threshold + 1e-6:
            if res.x[-1] > 1e-6:       # needs more GPUs than the cluster has
                return INFEASIBLE
            return 1000 * p.gpus + res.fun
        patterns.append(np.array(counts, dtype=float))


def problem(seq: Sequence, start: int, end: int) -> Problem:
    """The relaxation of every jam at arrivals ``start..end``."""
    forced: dict[int, int] = {}
    most: dict[int, int] = {}
    whole = 0
    for j, task in enumerate(seq.arrivals):
        res = task.resources
        if res.is_share:
            if j < start and res.gpu_milli <= JAM and not res.gpu_models:
                forced[res.gpu_milli] = forced.get(res.gpu_milli, 0) + 1
            if j < end or res.gpu_milli < JAM:
                most[res.gpu_milli] = most.get(res.gpu_milli, 0) + 1
        elif j < end:
            whole += res.gpus
    return Problem(seq.gpus, forced, most, whole, jammed=end < len(seq.arrivals))


def lp_bound(seq: Sequence, parts: int = 8, splits: int = 12) -> tuple[float, int]:
    """(least waste in milli over every possible jam, the arrival of the best interval's start)."""
    n = len(seq.arrivals)
    first = next((i for i in range(n + 1) if seq.touched[i] >= seq.gpus), n)
    edges = sorted({first + (n - first) * q // parts for q in range(parts + 1)})
    heap = [(least_waste(problem(seq, a, b)), a, b) for a, b in zip(edges, edges[1:])]
    heap.append((least_waste(problem(seq, n, n)), n, n))        # no jam at all
    heapq.heapify(heap)
    for _ in range(splits):
        value, a, b = heap[0]
        if b - a <= 1:
            break
        heapq.heappop(heap)
        mid = (a + b) // 2
        heapq.heappush(heap, (least_waste(problem(seq, a, mid)), a, mid))
        heapq.heappush(heap, (least_waste(problem(seq, mid, b)), mid, b))
    value, a, _ = heap[0]
    return max(0.0, value), a


def _both(args: tuple[str, int, bool]) -> tuple[Bound, float | None]:
    pod_list, seed, with_lp = args
    nodes, tasks = load_nodes(TRACE_DIR), load_tasks(pod_list, TRACE_DIR)
    gpus = sum(len(n.gpus) for n in nodes)
    counted = bound(pod_list, seed, tasks, gpus)
    if not with_lp:
        return counted, None
    milli, _ = lp_bound(Sequence(workload(tasks, gpus * 1000, seed), gpus))
    return counted, milli / (gpus * 1000)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpusched.sim.packing_bound", description=__doc__.split("\n\n")[0])
    parser.add_argument("--lists", default="all", help=f"comma-separated, or 'all' ({','.join(POD_LISTS)})")
    parser.add_argument("--seeds", type=int, default=len(SEEDS))
    parser.add_argument("--first-seed", type=int, default=SEEDS[0])
    parser.add_argument("--no-lp", action="store_true", help="the counting bound only (no scipy, seconds)")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    args = parser.parse_args(argv)
    lists = POD_LISTS if args.lists == "all" else tuple(args.lists.split(","))
    unknown = [p for p in lists if p not in POD_LISTS]
    if unknown:
        parser.error(f"unknown pod list: {', '.join(unknown)}")
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    work = [(pod_list, seed, not args.no_lp) for pod_list in lists for seed in seeds]
    if args.jobs > 1:
        with Pool(args.jobs) as pool:
            results = pool.map(_both, work, chunksize=1)
    else:
        results = [_both(w) for w in work]
    print("Unallocated GPU capacity at 130 % arrived that any never-refusing policy leaves, "
          f"%, mean of seeds {seeds.start}..{seeds.stop - 1}")
    print(f"{'pod list':<11} {'jam at':>7} {'forced 810s':>11} {'holes GPUs':>10} {'fill GPUs':>9} "
          f"{'counting >=':>11} {'LP >=':>6} {'LP min..max':>12}")
    for pod_list in lists:
        runs = [b for b, _ in results if b.pod_list == pod_list]
        lps = [lp for b, lp in results if b.pod_list == pod_list and lp is not None]
        lp = f"{100 * mean(lps):>6.2f} {100 * min(lps):>5.2f}..{100 * max(lps):.2f}" if lps else f"{'-':>6} {'-':>12}"
        print(f"{pod_list:<11} {100 * mean(b.jam_at for b in runs):>6.1f}% {mean(b.forced.get(JAM, 0) for b in runs):>11.0f} "
              f"{mean(b.holes_milli for b in runs) / 1000:>10.1f} {mean(b.fill_milli for b in runs) / 1000:>9.1f} "
              f"{100 * mean(b.waste for b in runs):>11.2f} {lp}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
