"""The fault rig's checker (tests/rig/checker.py) on made-up records: two copies of one
attempt's worker alive at once are a double run, one after the other are not; a replica's
snapshot or listing that is not what a replay of the log holds is a disagreement."""
from __future__ import annotations

import json

from gpusched.adapters.log import codec
from gpusched.adapters.log.restore import decode_state
from gpusched.core import events as ev
from gpusched.core.reducer import apply
from gpusched.core.snapshot import snapshot_bytes
from gpusched.core.state import ClusterState
from tests.rig.checker import _pct, disagreements, double_runs
from tests.unit.core.builders import make_node, make_spec
from tests.workloads.intervals import Interval, lost_gpu_seconds


def run(start: float, end: float, gpu: str = "g0", attempt: int = 0) -> Interval:
    return Interval(gpu, "job-1", attempt, 0, start, end)


def test_two_copies_of_one_attempt_at_once_are_a_double_run():
    assert double_runs([run(0, 5), run(4, 8, gpu="g1")]) != []


def test_copies_one_after_the_other_and_other_attempts_are_not():
    assert double_runs([run(0, 5), run(5.5, 8, gpu="g1")]) == []
    assert double_runs([run(0, 5), run(1, 8, attempt=1)]) == []   # attempts_overlap's concern, not this one


def test_percentiles_interpolate():
    assert _pct([1.0, 2.0, 3.0], 50) == 2.0
    assert _pct([1.0, 3.0], 50) == 2.0
    assert _pct([4.0], 99) == 4.0


def _log_and_states():
    """Four events of one partition, and the state after each (what a replica would snapshot)."""
    events = [ev.NodeRegistered(node=make_node("n1"), event_id="e1", time=1.0),
              ev.JobSubmitted(job_id="j1", spec=make_spec(), event_id="e2", time=2.0),
              ev.JobSubmitted(job_id="j2", spec=make_spec(), event_id="e3", time=3.0),
              ev.JobCancelled(job_id="j2", reason="by test", event_id="e4", time=4.0)]
    state, states = ClusterState(), []
    for offset, e in enumerate(events):
        apply(state, e)
        state.offset = offset
        states.append(snapshot_bytes(state))
    return {0: [(o, codec.encode(e, "default")) for o, e in enumerate(events)]}, states


def test_replicas_agree_when_every_snapshot_is_the_replay_at_its_offset():
    log, states = _log_and_states()
    compared, found = disagreements(log, {0: [(0, states[1]), (1, states[3])]}, {"j1": "PENDING", "j2": "CANCELLED"})
    assert (compared, found) == (2, [])


def test_a_snapshot_that_is_not_the_replay_at_its_offset_disagrees():
    log, states = _log_and_states()
    lying = decode_state(states[2])     # the state after offset 2 ...
    lying.offset = 3                    # ... claiming to cover offset 3
    compared, found = disagreements(log, {0: [(0, snapshot_bytes(lying))]}, {})
    assert compared == 1 and found and "offset 3" in found[0]


def test_admission_listing_a_phase_the_log_does_not_hold_disagrees():
    log, _ = _log_and_states()
    _, found = disagreements(log, {}, {"j1": "PENDING", "j2": "PENDING"})
    assert found == ["j2: admission lists PENDING, a replay of the log CANCELLED"]


def test_lost_work_is_what_ran_and_the_next_attempt_did_not_resume_from(tmp_path):
    records = [  # attempt 0 ran 10 s on 2 GPUs and checkpointed 6 s of it; attempt 1 finished
        {"event": "start", "t": 100.0, "pid": 1, "gpus": "g0,g1", "job": "j", "attempt": 0, "worker": 0,
         "resumed_from": 0.0},
        {"event": "tick", "t": 110.0, "pid": 1},
        {"event": "start", "t": 120.0, "pid": 2, "gpus": "g2,g3", "job": "j", "attempt": 1, "worker": 0,
         "resumed_from": 6.0},
        {"event": "end", "t": 125.0, "pid": 2, "how": "done"},
        {"event": "start", "t": 100.0, "pid": 3, "gpus": "g4", "job": "k", "attempt": 0, "worker": 0,
         "resumed_from": 0.0},   # never replaced: nothing lost
        {"event": "end", "t": 130.0, "pid": 3, "how": "done"}]
    (tmp_path / "record.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    assert lost_gpu_seconds(tmp_path) == (10.0 - 6.0) * 2
