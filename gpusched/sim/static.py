"""``gpusched simulate static``: the FGD paper's static packing benchmark, on production code.

The method (``../shared/traces/README.md``, as the paper's simulator does it): the
cluster is the openb GPU node list; the workload is every task of a pod list plus tasks
drawn at random (with replacement, seeded) while the requested GPU stays within 130 % of
the cluster's; that list is shuffled (seeded) and offered one task at a time: each is
placed on arrival or fails, and nothing leaves, moves or is retried. The GPU allocation
ratio (allocated milli / cluster milli) is recorded after each percent of arrived GPU
request, 0..130 %; the headline is the ratio at 130 %, the mean of 10 seeds.

How it runs here, so that every figure is a figure of the production code:

* nodes are registered (``NodeRegistered``) in a seeded random order. Policies break
  ties by registration order, so this randomises ties per seed, as the reference
  simulator does by renaming its nodes with a random prefix;
* the tasks are submitted (``JobSubmitted``) in the shuffled order and ONE scheduling
  cycle (``Scheduler``: FIFO queue, no cap on decisions) offers them one at a time in that
  order: each is placed by the policy and booked, so the next sees it, or fails. Within a
  cycle capacity only shrinks, so a job that fails would fail again: it is never retried;
* the decisions are applied through the reducer as ``JobPlaced`` events in arrival order
  (each must be accepted), the failed jobs cancelled (``JobCancelled``), and the ratio is
  read from the reducer's state (the team's allocated GPU milli) as the tasks arrive.
"""
from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import dataclass, field
from multiprocessing import Pool
from pathlib import Path

from gpusched.core import events as ev
from gpusched.core.model import NodeInfo
from gpusched.core.reducer import apply
from gpusched.core.state import ClusterState
from gpusched.policies.memory import CycleMemory
from gpusched.policies.placement.registry import make_placement, parse_placement
from gpusched.policies.scheduler import Scheduler, SchedulerConfig
from gpusched.sim import figures, report
from gpusched.sim.traces import POD_LISTS, TEAM, TRACE_DIR, Task, load_nodes, load_tasks

LOAD = 1.30          # offered GPU request, as a share of the cluster's GPUs
POINTS = 130         # percent of arrived GPU request the curve goes to
SEEDS = tuple(range(42, 52))   # the reference run scripts' seeds (42..51)
POLICIES = ("random", "dot-product", "gpu-clustering", "gpu-packing", "best-fit", "fgd", "fgd-lookahead")


@dataclass(slots=True)
class Run:
    pod_list: str
    policy: str
    seed: int
    curve: list[float]            # allocation ratio after 0..130 % of GPU request arrived
    tasks: int = 0
    placed: int = 0
    seconds: float = 0.0
    failed_by_shape: dict[str, int] = field(default_factory=dict)

    @property
    def final(self) -> float:
        return self.curve[-1]


def workload(tasks: list[Task], capacity_milli: int, seed: int, load: float = LOAD) -> list[Task]:
    """All tasks, then random draws while the total GPU request stays within ``load`` of
    the capacity (the first draw that would pass it ends the list), shuffled."""
    rng = random.Random(seed)
    out = list(tasks)
    total, target = sum(t.gpu_milli for t in tasks), load * capacity_milli
    while True:
        task = tasks[rng.randrange(len(tasks))]
        if total + task.gpu_milli > target:
            break
        out.append(task)
        total += task.gpu_milli
    rng.shuffle(out)
    return out


def simulate(pod_list: str, policy: str, seed: int, trace_dir: Path = TRACE_DIR) -> Run:
    return pack(load_nodes(trace_dir), load_tasks(pod_list, trace_dir), policy, seed, pod_list)


def pack(nodes: list[NodeInfo], tasks: list[Task], policy: str, seed: int, label: str = "") -> Run:
    """One run of the method on any cluster and task list (``simulate`` for the trace)."""
    started = time.perf_counter()
    capacity = sum(len(n.gpus) for n in nodes) * 1000
    arrivals = workload(tasks, capacity, seed)
    state = ClusterState()
    for i, node in enumerate(random.Random(f"nodes:{seed}").sample(nodes, len(nodes))):
        apply(state, ev.NodeRegistered(event_id=f"node-{i}", node=node))
    job_ids = [f"{label or 'pack'}-{seed}-{i:06d}" for i in range(len(arrivals))]
    for job_id, task in zip(job_ids, arrivals):
        outcome = apply(state, ev.JobSubmitted(event_id=f"submit-{job_id}", job_id=job_id, spec=task.spec(job_id)))
        if not outcome.accepted:
            raise RuntimeError(f"the reducer rejected the submission of {job_id}: {outcome.reason}")

    name, args = parse_placement(policy)
    # One cycle offers every arrival: no cap on decisions nor on jobs tested.
    scheduler = Scheduler(SchedulerConfig(queue="fifo", placement=name, placement_args=args,
                                          max_decisions=len(arrivals), max_job_test=len(arrivals)))
    decisions = {d.job_id: d for d in scheduler.cycle(state, 0.0, CycleMemory())}

    run = Run(label, policy, seed, [0.0] * (POINTS + 1), tasks=len(arrivals))
    arrived = reached = 0
    for job_id, task in zip(job_ids, arrivals):
        decision = decisions.get(job_id)
        if decision is not None:
            outcome = apply(state, ev.JobPlaced(event_id=f"place-{job_id}", job_id=job_id, attempt=decision.attempt,
                                                workers=decision.workers, policy=policy))
            if not outcome.accepted:
                raise RuntimeError(f"the reducer rejected {policy}'s placement of {job_id}: {outcome.reason}")
            run.placed += 1
        else:
            apply(state, ev.JobCancelled(event_id=f"cancel-{job_id}", job_id=job_id, reason="no room on arrival"))
            shape = _shape_name(task)
            run.failed_by_shape[shape] = run.failed_by_shape.get(shape, 0) + 1
        arrived += task.gpu_milli
        ratio = state.team_usage(TEAM).gpu_milli / capacity
        while reached < min(arrived * 100 // capacity, POINTS):
            reached += 1
            run.curve[reached] = ratio
    run.curve[reached + 1:] = [ratio] * (POINTS - reached)
    run.seconds = time.perf_counter() - started
    return run


def _shape_name(task: Task) -> str:
    res = task.resources
    if res.is_share:
        return "share"
    return f"{res.gpus}-gpu" if res.gpus else "cpu"


def _simulate(args: tuple[str, str, int, Path]) -> Run:
    return simulate(*args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpusched simulate static", description=__doc__.split("\n\n")[0])
    parser.add_argument("--all", action="store_true", help="every pod list, every policy, 10 seeds")
    parser.add_argument("--lists", default="default", help=f"comma-separated, or 'all' ({','.join(POD_LISTS)})")
    parser.add_argument("--policies", default="best-fit,fgd,fgd-lookahead",
                        help="comma-separated, or 'all'; a policy's arguments after it, e.g. "
                             "fgd-lookahead:patience=0.2")
    parser.add_argument("--seeds", type=int, default=len(SEEDS), help="how many seeds (default 10)")
    parser.add_argument("--first-seed", type=int, default=SEEDS[0], help="seeds count up from it (default 42)")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--trace-dir", type=Path, default=TRACE_DIR)
    parser.add_argument("--out", type=Path, default=Path("results/static"), help="where the JSON/CSV/PNG go")
    parser.add_argument("--publish", type=Path, metavar="FOLDER",
                        help=f"also write the headline figures to FOLDER/static.json and .md, or "
                             f"static-seeds-<first>-<last> for other seeds than the default (the published "
                             f"figures: {figures.DEFAULT_FOLDER})")
    args = parser.parse_args(argv)
    lists = POD_LISTS if args.all or args.lists == "all" else tuple(args.lists.split(","))
    policies = POLICIES if args.all or args.policies == "all" else tuple(args.policies.split(","))
    unknown = [p for p in lists if p not in POD_LISTS]
    if unknown:
        parser.error(f"unknown pod list: {', '.join(unknown)}")
    for policy in policies:
        try:
            name, settings = parse_placement(policy)
            make_placement(name, **settings)   # arguments in range
        except ValueError as exc:
            parser.error(str(exc))
    seeds = tuple(range(args.first_seed, args.first_seed + args.seeds))
    work = [(pod_list, policy, seed, args.trace_dir) for pod_list in lists for policy in policies for seed in seeds]
    started = time.perf_counter()
    if args.jobs > 1:
        with Pool(args.jobs) as pool:
            runs = pool.map(_simulate, work, chunksize=1)
    else:
        runs = [_simulate(w) for w in work]
    wall = time.perf_counter() - started
    print(report.table(runs, lists, policies))
    print(f"\n{len(runs)} runs in {wall:.0f} s wall ({sum(r.seconds for r in runs):.0f} s of simulation) "
          f"on {args.jobs} process(es)")
    paths = report.write(runs, lists, policies, args.out, wall)
    if args.publish:
        command = figures.command_line("gpusched simulate static", argv)
        name = "static" if seeds[0] == SEEDS[0] else f"static-seeds-{seeds[0]}-{seeds[-1]}"
        paths += figures.publish(args.publish, name, command, report.figures(runs, lists, policies),
                                 f"```text\n{report.table(runs, lists, policies)}\n```")
    for path in paths:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
