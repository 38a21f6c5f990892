"""bench/preemptor_bench.py's ``--node-event register``: the rounds after the first take
turns, none, a node registering again as it was, a new node joining another pool; each
round's decisions are checked against the full scan's."""
from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[3] / "bench"
sys.path.insert(0, str(BENCH))

import preemptor_bench as bench  # noqa: E402


def test_node_events_take_turns_and_leave_the_pool_as_it_was():
    log = bench.full_pool(3, pending=2)
    jobs = {name: set(node.jobs) for name, node in log.state.nodes.items()}
    epoch = log.state.capacity_epoch
    kinds = [bench.node_event(log, 3, r, bench.NOW) for r in range(1, 10)]
    assert kinds == ["kept", "registered again", "joined"] * 3
    state = log.state
    # Nodes 0, 1, 2 registered again (the same inventory, their jobs kept); spares 0-2 joined.
    assert state.capacity_epoch == epoch + 6
    assert sorted(n for n in state.nodes if n.startswith("spare")) == ["spare-00000", "spare-00001", "spare-00002"]
    assert {state.nodes[n].info.pool for n in state.nodes if n.startswith("spare")} == {"spare"}
    assert {name: set(node.jobs) for name, node in state.nodes.items() if name in jobs} == jobs
    assert all(state.nodes[n].info == bench.node_info(i) for i, n in enumerate(sorted(jobs)))


def test_main_times_each_kind_of_round(monkeypatch, capsys):
    monkeypatch.setattr(bench.gc, "freeze", lambda: None)   # the test process's objects stay collectable
    monkeypatch.setattr(sys, "argv", ["preemptor_bench.py", "--nodes", "4", "--pending", "4", "--repeats", "1",
                                      "--node-event", "register"])
    bench.main()
    out = capsys.readouterr().out
    for label in ("a round later, a node registered again", "a round later, a node joined",
                  "preemption round, a round later"):
        assert f"     4 {label:>40}" in out
