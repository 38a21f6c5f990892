"""Benchmark: a node-agent's CPU per pool event, folding its pool's whole log (``--source
log``) or reading its node's work view (``--source view``), side by side, without a broker.

the pool workload (``pool_workload.py``) (``--nodes`` nodes) is generated in memory and encoded
as the pool log holds it. Log: one agent decodes every record, folds it with the reducer
and looks at the jobs it touched for its own workers — the same for every agent of the
pool. View: the writer (once, for the whole pool) folds the log and builds each node's
records (``ViewBuilder``) and encodes them; each agent decodes and applies only its own
node's records (``NodeView``). CPU time (``process_time``), cyclic GC off, best of
``--repeat``; what the Kafka clients spend fetching grows with the records fetched in
both cases and is not counted.

The writer's cost beyond the relay's fold is measured three ways over the same events:
live (a record built per event, each job's spec and workers encoded once per attempt),
live without that memo (every record encodes them again), a replay as the writer did it
before going live built the views from the folded state (every event's records built, the
latest per key kept and encoded at go-live, no memo), and a replay as it does it now
(``note`` per event, the records built once from the folded state at go-live).

    .venv/bin/python bench/agent_view_bench.py --nodes 50 --count 100000
"""
from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.pool_workload import POOL, PoolSim  # noqa: E402
from gpusched.adapters.log import codec  # noqa: E402
from gpusched.adapters.nodes.work_view import NodeView, ViewBuilder, decode_record, job_content  # noqa: E402
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


class UnmemoizedBuilder(ViewBuilder):
    """Every record encodes the job's spec and workers anew (the builder before its memo)."""

    def _content(self, job, node, state):
        return job_content(job, node, state)


def writer(wire: list[bytes], builder_type=ViewBuilder) -> dict[str, list[tuple]]:
    """The relay's extra work, live: its fold (which it does anyway) is not counted apart."""
    state, builder, out = ClusterState(), builder_type(), {}
    for offset, value in enumerate(wire):
        event, _ = codec.decode(value)
        for record in builder.records(0, offset, event, apply(state, event), state):
            out.setdefault(record.node, []).append(record.encode())
    return out


def per_event_replay(wire: list[bytes]) -> int:
    """The replay before: every event's records built, the latest per key encoded at go-live."""
    state, builder, latest = ClusterState(), UnmemoizedBuilder(), {}
    for offset, value in enumerate(wire):
        event, _ = codec.decode(value)
        for record in builder.records(0, offset, event, apply(state, event), state):
            latest[(record.node, record.key)] = record
    return len([record.encode() for record in latest.values()])


def replaying_writer(wire: list[bytes]) -> int:
    """The writer's replay: the fold, a note per event, the records built at go-live."""
    state, builder = ClusterState(), ViewBuilder()
    for offset, value in enumerate(wire):
        event, _ = codec.decode(value)
        builder.note(0, offset, event, apply(state, event), state)
    return len([record.encode() for record in builder.resync({0: state})])


def relay_fold(wire: list[bytes]) -> None:
    state = ClusterState()
    for value in wire:
        apply(state, codec.decode(value)[0])


def view_agents(views: dict[str, list[tuple[bytes, bytes]]]) -> int:
    applied = 0
    for records in views.values():
        view = NodeView()
        for key, value, headers in records:
            applied += view.apply(key.decode(), decode_record(value, headers))
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
    unmemo_s = min(timed(writer, wire, UnmemoizedBuilder)[0] for _ in range(args.repeat))
    old_replay_s, rebuilt = min((timed(per_event_replay, wire) for _ in range(args.repeat)), key=lambda r: r[0])
    replay_s, resynced = min((timed(replaying_writer, wire) for _ in range(args.repeat)), key=lambda r: r[0])
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
    print(f"the writer beyond its fold, µs of CPU per pool event (fold alone {1e6 * fold_s / n:.2f}):")
    print(f"{'  live, spec/workers memo':36}{1e6 * extra_writer / n:8.2f}")
    print(f"{'  live, no memo':36}{1e6 * max(0.0, unmemo_s - fold_s) / n:8.2f}")
    print(f"{'  replay, records per event':36}{1e6 * max(0.0, old_replay_s - fold_s) / n:8.2f}"
          f"   ({rebuilt} records at go-live)")
    print(f"{'  replay, note; build at go-live':36}{1e6 * max(0.0, replay_s - fold_s) / n:8.2f}"
          f"   ({resynced} records at go-live)")


if __name__ == "__main__":
    main()
