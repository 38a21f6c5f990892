"""Snapshots: a restored state is the same state — same digest, same bytes when written
again, and the same fold of any further events (duplicates of old ones included)."""
from __future__ import annotations

import dataclasses
import json
import zlib
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpusched.core import events as ev
from gpusched.core import snapshot as snap
from gpusched.core.catalog import CATALOG
from gpusched.core.digest import digest
from gpusched.core.mig import parse_profile
from gpusched.core.model import (
    EXIT_LOST, GpuInfo, GpuSlot, JobKind, JobPhase, JobSpec, NodeInfo, NodeStatus, WorkerAssignment,
    WorkerResources,
)
from gpusched.core.reducer import apply
from gpusched.core.snapshot import SnapshotError, snapshot_bytes, snapshot_doc, state_from_snapshot
from gpusched.core.state import ClusterState, DedupeWindow, GpuState, JobState, NodeState, Usage
from tests.unit.core.builders import _sample_state

SETTINGS = settings(max_examples=100, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
MODELS = ("H100-80GB", "A100-40GB", "L40S-48GB")
POOLS = ("default", "default", "other")


_INTS: dict[tuple[int, int], st.SearchStrategy[int]] = {}


# --- a random history, drawn step by step from the state it builds ----------------------
class Gen:
    def __init__(self, data) -> None:
        self.data = data
        self.n = 0
        self.now = 100.0
        self.events: list[ev.Event] = []

    def int(self, lo: int, hi: int) -> int:
        strategy = _INTS.get((lo, hi))
        if strategy is None:   # building a strategy per draw costs more than the reducer
            strategy = _INTS[(lo, hi)] = st.integers(lo, hi)
        return self.data.draw(strategy)

    def pick(self, seq):
        seq = list(seq)
        return seq[self.int(0, len(seq) - 1)]

    def event(self, cls, **kw) -> ev.Event:
        self.n += 1
        self.now += self.pick([0.0, 0.5, 7.25, 300.0])
        e = cls(event_id=f"e{self.n}", time=self.now, producer=self.pick(["", "p1"]), **kw)
        self.events.append(e)
        return e

    def node_info(self, name: str) -> NodeInfo:
        model = self.pick(MODELS)
        cat = CATALOG[model]
        return NodeInfo(
            name=name, pool=self.pick(POOLS), cpu_milli=self.pick([4_000, 64_000]),
            memory_mib=self.pick([16_000, 512_000]),
            gpus=tuple(GpuInfo(i, f"GPU-{name}-{i}", model, cat.memory_mib, cat.mig_capable)
                       for i in range(self.int(1, 4))),
            labels=self.pick([(), (("rack", "r1"),), (("rack", "r2"), ("spine", "s0"))]),
            simulated=self.pick([False, True]), agent_id=f"a{self.n}",
        )

    def spec(self) -> JobSpec:
        form = self.pick(["whole", "whole", "share", "mig", "cpu"])
        return JobSpec(
            name=self.pick(["j", "train", "héllo \"quoted\"\n"]), team=self.pick(["t1", "t2"]),
            pool=self.pick(POOLS), priority_class=self.pick(["training", "batch"]),
            kind=self.pick(list(JobKind)), workers=self.int(1, 3),
            resources=WorkerResources(
                gpus=self.int(1, 2) if form == "whole" else 0,
                gpu_milli=self.pick([250, 500]) if form == "share" else 0,
                mig_profile=self.pick(["1g", "2g.20gb", "3g"]) if form == "mig" else "",
                cpu_milli=self.pick([0, 1000]), memory_mib=self.pick([0, 4000]),
                gpu_models=self.pick([(), (), (), ("H100-80GB",), ("A100-40GB", "H100-80GB")]),
            ),
            max_runtime_s=self.pick([0.0, 3600.0]), preemptible=self.pick([True, False]),
            checkpoint_interval_s=self.pick([0.0, 60.0]), command=self.pick([(), ("python", "t.py")]),
            simulated_duration_s=self.pick([0.0, 1.5]), org=self.pick(["", "org1"]),
            max_restarts=self.int(0, 2),
        )

    def placement(self, state: ClusterState, job) -> tuple[WorkerAssignment, ...]:
        """Mostly a valid placement when capacity allows (first fit from a random node);
        sometimes a careless one the reducer rejects."""
        res = job.spec.resources
        careless = self.int(0, 5) == 0
        names = sorted(n for n, s in state.nodes.items()
                       if careless or (s.info.pool == job.spec.pool and s.schedulable)) or ["ghost"]
        first = self.int(0, len(names) - 1)
        names = names[first:] + names[:first]
        taken: set[tuple[str, int]] = set()
        out = []
        for w in range(job.spec.workers):
            for name in names:
                node = state.nodes.get(name)
                slots = self._slots(node, res, taken, careless) if node else ()
                if slots is not None:
                    break
            else:
                name, slots = names[0], ()
            taken.update((name, s.index) for s in slots)
            out.append(WorkerAssignment(w, name, slots))
        return tuple(out)

    def _slots(self, node, res: WorkerResources, taken: set, careless: bool) -> tuple[GpuSlot, ...] | None:
        ok = [i for i, g in enumerate(node.gpus)
              if (node.name, i) not in taken and (careless or res.allows(g.info.model))]
        if res.is_mig:
            p = parse_profile(res.mig_profile)
            for i in ok:
                for start in p.starts:
                    if careless or node.gpus[i].fits_mig(p, start):
                        return (GpuSlot(i, p.milli, res.mig_profile, start),)
            return None
        if res.is_share:
            fit = [i for i in ok if careless or node.gpus[i].fits_share(res.gpu_milli)]
            return (GpuSlot(fit[0], res.gpu_milli),) if fit else None
        fit = [i for i in ok if careless or node.gpus[i].fits_whole()]
        return tuple(GpuSlot(i) for i in fit[:res.gpus]) if len(fit) >= res.gpus else None

    def step(self, state: ClusterState) -> ev.Event:
        """One event, chosen from what the state holds (valid more often than not)."""
        jobs = sorted(state.jobs)
        live = sorted(j for j, s in state.jobs.items() if s.phase.holds_gpus)
        kind = self.pick(["submit"] * 4 + ["place"] * 5 + ["start"] * 5 + ["finish"] * 3 + [
            "node", "node", "health", "cancel", "checkpoint", "preempt", "preempt", "fail", "dup", "lost",
            "cordon"])
        if kind == "submit" or not jobs:
            job_id = self.pick(jobs) if jobs and self.int(0, 9) == 0 else f"job{self.n}"
            return self.event(ev.JobSubmitted, job_id=job_id, spec=self.spec(),
                              idempotency_key=self.pick(["", "", "k1", "k2"]))
        if kind == "place":
            pending = list(state.pending) or jobs
            job = state.jobs[self.pick(pending)]
            return self.event(ev.JobPlaced, job_id=job.job_id, attempt=job.attempt,
                              workers=self.placement(state, job), policy=self.pick(["", "best-fit"]))
        if kind == "node" or not state.nodes:
            names = sorted(state.nodes)
            name = self.pick(names) if names and self.int(0, 2) == 0 else f"n{len(state.nodes)}"
            info = self.node_info(name)
            if name in state.nodes and self.int(0, 1):   # agent restart, same inventory
                info = dataclasses.replace(state.nodes[name].info, agent_id=f"a{self.n}")
            return self.event(ev.NodeRegistered, node=info)
        node_name = self.pick(sorted(state.nodes))
        if kind == "health":
            return self.event(ev.GpuHealthChanged, node=node_name, gpu_index=self.int(0, 3),
                              healthy=self.pick([True, False]), reason="xid", xid=self.int(0, 79))
        if kind == "lost":
            return self.event(ev.NodeLost, node=node_name, reason="gone")
        if kind == "cordon":
            cordoned = sorted(n for n, s in state.nodes.items() if s.status is NodeStatus.CORDONED)
            if cordoned and self.int(0, 1):
                return self.event(ev.NodeUncordoned, node=self.pick(cordoned))
            return self.event(ev.NodeCordoned, node=node_name, reason=self.pick(["", "maintenance"]))
        if kind == "dup":
            return self.pick(self.events) if self.events else self.event(ev.NodeLost, node=node_name)
        if kind == "start":   # a worker of a placed job that has not started yet
            unstarted = [(j, w) for j in live for w in state.jobs[j].workers
                         if w.worker not in state.jobs[j].started]
            if unstarted and self.int(0, 5):
                j, w = self.pick(unstarted)
                return self.event(ev.WorkerStarted, job_id=j, attempt=state.jobs[j].attempt,
                                  worker=w.worker, node=w.node)
        job = state.jobs[self.pick(live if live and self.int(0, 5) else jobs)]
        worker = self.pick(job.workers) if job.workers else WorkerAssignment(0, node_name)
        if kind == "start":
            return self.event(ev.WorkerStarted, job_id=job.job_id, attempt=job.attempt,
                              worker=worker.worker, node=worker.node)
        if kind == "finish":
            return self.event(ev.WorkerFinished, job_id=job.job_id, attempt=job.attempt,
                              worker=worker.worker, node=worker.node,
                              exit_code=self.pick([0, 0, 0, 1, EXIT_LOST]), reason=self.pick(["", "oom"]))
        if kind == "cancel":
            return self.event(ev.JobCancelled, job_id=job.job_id, reason=self.pick(["", "user"]))
        if kind == "checkpoint":
            return self.event(ev.CheckpointSaved, job_id=job.job_id, attempt=job.attempt,
                              checkpoint=f"s3://ck/{self.n}", progress_s=float(self.int(0, 500)))
        if kind == "preempt":
            beneficiary = self.pick(list(state.pending) or jobs)
            planned = tuple(self.pick(list(state.nodes)) for _ in range(self.int(0, 2)))
            return self.event(ev.JobPreempted, job_id=job.job_id, attempt=job.attempt,
                              for_job=beneficiary, reason=self.pick(["", "priority"]), planned_nodes=planned)
        return self.event(ev.AttemptFailed, job_id=job.job_id, attempt=job.attempt,
                          reason="hung", charge=self.pick([True, False]))


def _outcome(o) -> tuple:
    return (o.accepted, o.reason, o.jobs, o.duplicate)


@contextmanager
def _bulk_encodings_from(size: int):
    """Lower the column length from which numbers are packed and repeated values are
    deduplicated, so small random states exercise those encodings too."""
    saved = snap._PACK_MIN, snap._DEDUPE_MIN
    snap._PACK_MIN = snap._DEDUPE_MIN = size
    try:
        yield
    finally:
        snap._PACK_MIN, snap._DEDUPE_MIN = saved


@pytest.mark.parametrize("bulk_from", [64, 1], ids=["default-encodings", "bulk-encodings-everywhere"])
@SETTINGS
@given(data=st.data())
def test_restored_state_is_the_same_state_and_folds_the_same(bulk_from, data):
    with _bulk_encodings_from(bulk_from):
        _round_trip_then_fold(data)


def _round_trip_then_fold(data):
    g = Gen(data)
    window = data.draw(st.sampled_from([200_000, 16, 3]))   # small windows: evictions matter
    original = ClusterState(dedupe=DedupeWindow(window))
    for _ in range(data.draw(st.integers(0, 80))):
        apply(original, g.step(original))
    original.offset = data.draw(st.integers(-1, 10**12))

    blob = snapshot_bytes(original)
    restored = state_from_snapshot(blob)
    assert digest(restored) == digest(original)
    assert snapshot_doc(restored) == snapshot_doc(original)   # every field, not just the digest
    assert snapshot_bytes(restored) == blob                   # deterministic bytes
    assert restored.offset == original.offset and restored.version == original.version
    assert list(restored.pending) == list(original.pending)
    assert restored.dedupe.ids() == original.dedupe.ids() and restored.dedupe.size == window

    # The same further events (old ones replayed as duplicates too) fold identically.
    for _ in range(data.draw(st.integers(1, 60))):
        e = g.step(original)
        assert _outcome(apply(original, e)) == _outcome(apply(restored, e))
        assert restored.version == original.version
    assert digest(restored) == digest(original)
    assert snapshot_doc(restored) == snapshot_doc(original)


def test_sample_state_round_trip_covers_bookings():
    state = _sample_state()
    restored = state_from_snapshot(snapshot_bytes(state))
    assert digest(restored) == digest(state)
    n = restored.nodes["n1"]
    assert [g.used_milli for g in n.gpus] == [1000, 1000, 0, 0] and n.gpus[3].mig_mask
    assert n.jobs == {"j0", "j2"} and n.info.label("rack") == "r1"
    assert restored.jobs["j0"].phase is JobPhase.PREEMPTING
    assert restored.nominations == state.nominations and restored.nominations["vip"][0] == ("n1",)
    assert restored.idempotency == {"t1/k0": "j0", "t1/k1": "j1", "t1/k2": "j2"}
    assert restored.usage["t1"].jobs == 2 and restored.offset == 41
    assert restored.jobs["j1"].finished == {0: 0} and restored.jobs["j1"].phase is JobPhase.SUCCEEDED


def test_every_state_field_has_a_place_in_the_snapshot():
    schema = snap._schema()
    for cls in (ClusterState, NodeState, GpuState, JobState, Usage, NodeInfo, GpuInfo, JobSpec,
                WorkerResources, WorkerAssignment, GpuSlot):
        # the journals' entries are left out (tests/unit/core/test_snapshot_journal.py), and
        # the count of pending jobs, recounted on restore, and each job's key in it, built
        # again where counted (tests/unit/core/test_pending_counts.py)
        left_out = {ClusterState: ("changes", "node_changes", "pending_counts"), JobState: ("pending_key",)}
        expected = [f.name for f in dataclasses.fields(cls) if f.name not in left_out.get(cls, ())]
        assert schema[cls.__name__] == expected, cls.__name__


def _doc(state: ClusterState) -> dict:
    return json.loads(json.dumps(snapshot_doc(state)))


def _jobs(doc: dict) -> dict:
    """The JobState columns of a document (jobs: lengths, keys, values)."""
    return doc["state"]["jobs"]["v"]


def test_a_snapshot_from_before_a_field_existed_restores_with_its_default():
    state = _sample_state()
    doc = _doc(state)
    doc["schema"]["JobState"].remove("checkpoint_at")
    del _jobs(doc)["checkpoint_at"]
    restored = state_from_snapshot(_doc_bytes(doc))
    assert all(j.checkpoint_at == 0.0 for j in restored.jobs.values())
    assert digest(restored) == digest(state)   # checkpoint_at is not part of the digest


def test_a_snapshot_with_fields_this_code_does_not_know_is_refused():
    doc = _doc(_sample_state())
    doc["schema"]["JobState"].append("from_the_future")
    _jobs(doc)["from_the_future"] = [1] * len(_jobs(doc)["job_id"])
    with pytest.raises(SnapshotError, match="from_the_future"):
        state_from_snapshot(_doc_bytes(doc))


# --- what is not a snapshot ---------------------------------------------------------
def _doc_bytes(doc) -> bytes:
    return snap.MAGIC + bytes([snap.FORMAT_VERSION]) + zlib.compress(json.dumps(doc).encode())


def test_corrupt_foreign_or_newer_bytes_raise_snapshot_error():
    good = snapshot_bytes(_sample_state())
    flipped = bytearray(good)
    flipped[len(flipped) // 2] ^= 0x5A
    doc = _doc(_sample_state())
    assert _jobs(doc)["job_id"][0] == "j0"
    bad_type = _doc(_sample_state())
    _jobs(bad_type)["seq"][0] = "seven"
    bad_phase = _doc(_sample_state())
    _jobs(bad_phase)["phase"][0] = "exploded"
    unknown_pending = _doc(_sample_state())
    pending = unknown_pending["state"]["pending"]
    pending["n"][0] += 1
    pending["k"].append("nobody")
    pending["v"].append(None)
    ghost_node = _doc(_sample_state())
    _jobs(ghost_node)["workers"]["items"]["node"][0] = "ghost"   # j0's worker, j0 holds GPUs
    short_column = _doc(_sample_state())
    _jobs(short_column)["seq"].pop()
    bad_lengths = _doc(_sample_state())
    _jobs(bad_lengths)["workers"]["n"][0] += 1
    repeated_key = _doc(_sample_state())
    repeated_key["state"]["idempotency"]["k"][1] = repeated_key["state"]["idempotency"]["k"][0]
    missing = dict(doc)
    del missing["schema"]
    cases = {
        "empty": b"",
        "pickle": b"\x80\x04\x95\x00",
        "bad magic": b"XXXX" + good[4:],
        "newer version": snap.MAGIC + bytes([snap.FORMAT_VERSION + 1]) + good[5:],
        "flipped byte": bytes(flipped),
        "truncated": good[:-7],
        "trailing": good + b"junk",
        "not json": snap.MAGIC + bytes([snap.FORMAT_VERSION]) + zlib.compress(b"{nope"),
        "not a dict": _doc_bytes([1, 2]),
        "bad type": _doc_bytes(bad_type),
        "bad phase": _doc_bytes(bad_phase),
        "unknown pending job": _doc_bytes(unknown_pending),
        "job on an unknown node": _doc_bytes(ghost_node),
        "short column": _doc_bytes(short_column),
        "lengths do not add up": _doc_bytes(bad_lengths),
        "repeated key": _doc_bytes(repeated_key),
        "missing schema": _doc_bytes(missing),
    }
    for what, data in cases.items():
        try:
            state_from_snapshot(data)
        except SnapshotError:
            continue
        pytest.fail(f"{what}: restored without an error")


def test_version_error_says_which_versions():
    good = snapshot_bytes(ClusterState())
    with pytest.raises(SnapshotError, match="version 9"):
        state_from_snapshot(snap.MAGIC + bytes([9]) + good[5:])


def test_empty_state_round_trips():
    state = ClusterState()
    restored = state_from_snapshot(snapshot_bytes(state))
    assert digest(restored) == digest(state) and restored.offset == -1


def _find(doc: Any, key: str) -> dict:
    """The first column object in ``doc`` carrying ``key``."""
    todo = [doc]
    while todo:
        x = todo.pop()
        if isinstance(x, dict):
            if key in x:
                return x
            todo.extend(x.values())
        elif isinstance(x, list):
            todo.extend(x)
    raise AssertionError(f"no {key} column")


def test_corrupt_bulk_encodings_raise_snapshot_error():
    with _bulk_encodings_from(1):
        state = _sample_state()
        assert digest(state_from_snapshot(snapshot_bytes(state))) == digest(state)
        mutations = {
            "packed ints too short": lambda d: _find(d, "$i1").update({"$i1": _find(d, "$i1")["$i1"][:-4]}),
            "packed floats not base64": lambda d: _find(d, "$f8").update({"$f8": "!!not base64!!"}),
            "unknown packing": lambda d: _find(d, "$i1").update({"$i3": "AAAA"}),
            "index past the distinct values": lambda d: _find(d, "$i").update({"$n": 0}),
            "negative distinct count": lambda d: _find(d, "$i").update({"$n": -1}),
            "packed and plain at once": lambda d: _find(d, "$f8").update({"extra": 1}),
        }
        for what, mutate in mutations.items():
            doc = _doc(state)
            mutate(doc)
            try:
                state_from_snapshot(_doc_bytes(doc))
            except SnapshotError:
                continue
            pytest.fail(f"{what}: restored without an error")
