"""Benchmark: a node-agent's CPU per pool event, folding its pool's whole log (``--source
log``) or reading its node's work view (``--source view``), side by side, without a broker.

``replay_bench.py``'s pool workload (``--nodes`` nodes) is generated in memory and encoded
as the pool log holds it. Log: one agent decodes every record, folds it with the reducer
and looks at the jobs it touched for its own workers — the same for every agent of the
pool. View: the writer (once, for the whole pool) folds the log and builds each node's
records (``ViewBuilder``) and encodes them; each agent decodes and applies only its own
node's records (``NodeView``). CPU time (``process_time``), cyclic GC off, best of
``--repeat``; what the Kafka clients spend fetching grows with the records fetched in
both cases and is not counted.

    .venv/bin/python bench/agent_view_bench.py --nodes 50 --count 100000
"""
from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.replay_bench import POOL, PoolSim  # noqa: E402
from gpusched.adapters import codec  # noqa: E402
from gpusched.adapters.work_view import NodeView, ViewBuilder, decode_value  # noqa: E402
from gpusched.core.reducer import apply  # noqa: E402
from gpusched.core.state import ClusterState  # noqa: E402


def timed(fn, *args) -> tuple[float, object]:
    gc.disable()
    started = time.process_time()
    result = fn(*args)
    elapsed = time.process_time() - started
    gc.enable()
    return elapsed, result


def log_agent(wire: list[bytes], node: str) -> int:
    """What one agent on the whole log does per record; how many jobs touched it."""
    state, mine = ClusterState(), 0
    for value in wire:
        event, _ = codec.decode(value)
        outcome = apply(state, event)
        if outcome.accepted:
            for job_id in outcome.jobs:
                job = state.jobs.get(job_id)
                if job is not None and any(w.node == node for w in job.workers):
                    mine += 1
    return mine


def writer(wire: list[bytes]) -> dict[str, list[tuple[bytes, bytes]]]:
    """The relay's extra work: its fold (which it does anyway) is not counted apart."""
    state, builder, out = ClusterState(), ViewBuilder(), {}
    for offset, value in enumerate(wire):
        event, _ = codec.decode(value)
        for record in builder.records(0, offset, event, apply(state, event), state):
            out.setdefault(record.node, []).append(record.encode())
    return out


def relay_fold(wire: list[bytes]) -> None:
    state = ClusterState()
    for value in wire:
        apply(state, codec.decode(value)[0])


def view_agents(views: dict[str, list[tuple[bytes, bytes]]]) -> int:
    applied = 0
    for records in views.values():
        view = NodeView()
        for key, value in records:
            applied += view.apply(key.decode(), decode_value(value))
    return applied


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=50)
    p.add_argument("--count", type=int, default=100_000)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    sim = PoolSim(args.seed, args.nodes)
    sim.run(args.count)
    wire = [codec.encode(e, POOL) for e in sim.events]
    n = len(wire)
    node = sim.node_names[0]
    log_s = min(timed(log_agent, wire, node)[0] for _ in range(args.repeat))
    fold_s = min(timed(relay_fold, wire)[0] for _ in range(args.repeat))
    write_s, views = min((timed(writer, wire) for _ in range(args.repeat)), key=lambda r: r[0])
    read_s = min(timed(view_agents, views)[0] for _ in range(args.repeat))
    records = sum(len(r) for r in views.values())
    per_agent_view = read_s / max(1, len(views))
    extra_writer = max(0.0, write_s - fold_s)
    print(f"{n} pool events, {args.nodes} nodes; view records written: {records} "
          f"({records / max(1, len(views)):.0f} per node)")
    print(f"{'':28}{'log':>12}{'view':>12}   (µs of CPU per pool event)")
    print(f"{'one agent':28}{1e6 * log_s / n:12.2f}{1e6 * per_agent_view / n:12.3f}")
    print(f"{f'all {args.nodes} agents':28}{1e6 * log_s * args.nodes / n:12.1f}{1e6 * read_s / n:12.2f}")
    print(f"{'writer (beyond its fold)':28}{'-':>12}{1e6 * extra_writer / n:12.2f}")
    print(f"{'cluster total':28}{1e6 * log_s * args.nodes / n:12.1f}{1e6 * (read_s + extra_writer) / n:12.2f}")


if __name__ == "__main__":
    main()
