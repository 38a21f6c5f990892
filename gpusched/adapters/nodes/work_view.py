"""The per-node work view: what each node must run, derived from the pool log.

A node-agent that folds its whole pool's log pays for every event of every node. The
work view gives it only its own: one compacted topic per node, ``<prefix>work.<node>``,
written by one follower of the pool log (``gpusched.adapters.nodes.work_writer``, run by the
relay) and read only by that node's principal (``gpusched.adapters.broker.kafka_acls``).
docs/design/design.md, "The per-node work view", has the reasons and the trade-offs.

Records (JSON values), keyed so that compaction keeps the latest of each:

- ``job:<job id>``: an attempt this node has workers of — attempt, phase, the job's spec,
  every worker of the attempt (other nodes' without their GPUs: a gang's ranks need them),
  the workers already finished, the rendezvous, the checkpoint to resume from, the
  addresses of the gang's nodes. Once the node has none left, a tombstone (no value; its
  offset in a header): compaction then drops the key, so a view holds only live work.
  ``starts`` is set once the log has said start for this attempt and rendezvous (a
  placement, a rendezvous), and stays set on the attempt's later records while it runs
  (placed or running): a reader that
  missed the placement's record (compacted away, or never written by a writer that
  died) still starts the worker, and the agent's own memory of what it launched keeps it
  to once. ``trace``: the job's trace context, where the writer traces; ``event``: the
  type of the pool-log event the record reflects, ``event_trace`` the context its
  envelope carried (the agent's consumer span names the one, has the other as parent).
- ``node``: the node's latest accepted registration (its event id, so the agent knows
  its own came through) and whether the log has since declared it lost.

Every record carries the pool-log partition and offset of the event it reflects. Per node
they are written in log order; a record rewritten after a writer restart carries the same
offset or a newer one, so a reader applies a key's record only if its offset is newer than
the one it applied: nothing is undone, and a lagging second writer cannot bring back an
older record.

``ViewBuilder`` is pure: it turns (offset, event, outcome, folded state) into the records
that changed, and is what the property tests drive. While the writer replays it only
``note``s what each event touched, and ``resync`` builds the records once, from the state
folded at go-live.
"""
from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any, Callable

from gpusched.adapters.log.codec import from_proto, to_proto
from gpusched.adapters.nodes.reports import check_node_name
from gpusched.core import events as ev
from gpusched.core.model import JobPhase, JobSpec, WorkerAssignment
from gpusched.core.state import ClusterState, JobState
from gpusched.v1 import types_pb2

WORK = "work."
NODE_KEY = "node"
JOB_KEY = "job:"
OFFSET_HEADER = "gpusched.view.offset"   # a tombstone's source offset (it has no value)
_STARTS = (ev.JobPlaced, ev.RendezvousSet)
_RUNS = (JobPhase.PLACED, JobPhase.RUNNING)


def work_topic(prefix: str, node: str) -> str:
    return f"{prefix}{WORK}{check_node_name(node)}"


@dataclass(frozen=True, slots=True)
class ViewRecord:
    node: str
    key: str            # NODE_KEY or JOB_KEY + job id
    value: dict

    @property
    def gone(self) -> bool:
        return bool(self.value.get("gone"))

    def encode(self) -> tuple[bytes, bytes | None, list[tuple[str, bytes]]]:
        """Key, value and headers as written: a ``gone`` record is a tombstone."""
        if self.gone:
            return self.key.encode(), None, [(OFFSET_HEADER, str(self.value["offset"]).encode())]
        return self.key.encode(), json.dumps(self.value, separators=(",", ":"), sort_keys=True).encode(), []


class ViewBuilder:
    """Which records of which node an event changed. Remembers, per job, the nodes that
    have a live record and its content, so it writes only what changed."""

    def __init__(self, trace_of: Callable[[str], dict | None] | None = None,
                 event_trace_of: Callable[[ev.Event], dict | None] | None = None) -> None:
        # job id -> its trace's carrier, sent along so the agent's worker spans join the
        # job's trace (``tracing.JOBS.carrier`` where the writer traces); event -> the
        # context its envelope carried, the parent of the agent's consumer span
        # (``tracing.consumed_carrier``)
        self.trace_of = trace_of
        self.event_trace_of = event_trace_of
        self.written: dict[tuple[str, str], dict] = {}   # (node, key) -> latest content
        # Nodes served by a node host: they read the pool log and have no work topic, so
        # no record is built for them (``skip_node``).
        self.skip: set[str] = set()
        self.job_nodes: dict[str, set[str]] = {}
        self.start_marks: dict[str, tuple[int, str]] = {}   # job -> (attempt, rendezvous) the log said start
        # what ``note`` kept while replaying: job -> (partition, offset, event type) of
        # the last event that touched it, the nodes its placements named, node records
        self.touched: dict[str, tuple[int, int, str]] = {}
        self.placed_on: dict[str, set[str]] = {}
        self.node_records: dict[str, ViewRecord] = {}
        # job -> (spec, workers, the spec encoded, node -> the workers encoded for it): a
        # record is built on every change of the job, its spec and workers change only
        # with a new attempt, and encoding them was most of a record's cost
        self._encoded: dict[str, tuple[object, object, str, dict[str, list[str]]]] = {}

    def records(self, partition: int, offset: int, event: ev.Event, outcome, state: ClusterState) -> list[ViewRecord]:
        if not outcome.accepted:
            return []
        where = {"partition": partition, "offset": offset}
        out: list[ViewRecord] = []
        if isinstance(event, (ev.NodeRegistered, ev.NodeLost)) and _node_name(event) not in self.skip:
            out.append(self._node(event, where))
        if isinstance(event, _STARTS):
            self._mark_starts(outcome.jobs, state)
        traced = self.event_trace_of(event) if self.event_trace_of is not None and outcome.jobs else None
        for job_id in outcome.jobs:
            out += self._job(job_id, state, where, type(event).__name__, traced)
        return out

    def note(self, partition: int, offset: int, event: ev.Event, outcome, state: ClusterState) -> None:
        """What a replayed event touched, for ``resync``: a few dict writes, no record built."""
        if not outcome.accepted:
            return
        if isinstance(event, (ev.NodeRegistered, ev.NodeLost)) and _node_name(event) not in self.skip:
            record = self._node(event, {"partition": partition, "offset": offset})
            self.node_records[record.node] = record
        if isinstance(event, _STARTS):
            self._mark_starts(outcome.jobs, state)
        if isinstance(event, ev.JobPlaced):
            self.placed_on.setdefault(event.job_id, set()).update(w.node for w in event.workers)
        name = type(event).__name__
        for job_id in outcome.jobs:
            self.touched[job_id] = (partition, offset, name)

    def resync(self, states: dict[int, ClusterState]) -> list[ViewRecord]:
        """The records of what ``note`` saw, built once from the folded ``states``, in
        source-offset order: every node record, every live job record of every job the
        replayed log touched (at the offset of its last event: newer than or equal to what
        a reader may have applied), and a tombstone for every node a placement named that
        has no work of the job left (its end may have come while no writer wrote)."""
        out = [r for r in self.node_records.values() if r.node not in self.skip]
        for job_id, (partition, offset, name) in self.touched.items():
            state = states[partition]
            out += self._job(job_id, state, {"partition": partition, "offset": offset}, name,
                             before=self.placed_on.get(job_id, set()))
        self.touched, self.placed_on, self.node_records = {}, {}, {}
        return sorted(out, key=lambda r: (r.value["partition"], r.value["offset"]))

    def skip_node(self, node: str) -> None:
        """Build no record for ``node`` from now on, and forget what was built for it."""
        self.skip.add(node)
        self.written = {k: v for k, v in self.written.items() if k[0] != node}
        for nodes in self.job_nodes.values():
            nodes.discard(node)

    def _mark_starts(self, job_ids, state: ClusterState) -> None:
        for job_id in job_ids:
            job = state.jobs.get(job_id)
            if job is not None:
                self.start_marks[job_id] = (job.attempt, job.rendezvous)

    def _node(self, event, where: dict) -> ViewRecord:
        if isinstance(event, ev.NodeRegistered):
            name = event.node.name
            content = {"registered": event.event_id, "agent_id": event.node.agent_id, "lost": False}
        else:
            name = event.node
            before = self.written.get((name, NODE_KEY), {})
            content = {"registered": before.get("registered", ""), "agent_id": before.get("agent_id", ""),
                       "lost": True}
        self.written[(name, NODE_KEY)] = content
        return ViewRecord(name, NODE_KEY, {**content, **where})

    def _job(self, job_id: str, state: ClusterState, where: dict, event: str, event_trace: dict | None = None,
             before: set[str] | None = None) -> list[ViewRecord]:
        job = state.jobs.get(job_id)
        now = nodes_with_work(job)
        before = self.job_nodes.get(job_id, set()) if before is None else before
        if self.skip:
            now, before = now - self.skip, before - self.skip
        key = JOB_KEY + job_id
        out = []
        for node in sorted(before - now):
            self.written.pop((node, key), None)
            out.append(ViewRecord(node, key, {"gone": True, **where}))
        starts = job is not None and job.phase in _RUNS and self.start_marks.get(job_id) == (job.attempt,
                                                                                          job.rendezvous)
        for node in sorted(now):
            content = self._content(job, node, state)
            if self.written.get((node, key)) != content:
                self.written[(node, key)] = content
                trace = self.trace_of(job_id) if self.trace_of is not None else None
                out.append(ViewRecord(node, key, {**content, **where, "starts": starts, "event": event,
                                                  **({"trace": trace} if trace else {}),
                                                  **({"event_trace": event_trace} if event_trace else {})}))
        if now:
            self.job_nodes[job_id] = now
        else:
            self.job_nodes.pop(job_id, None)
            self.start_marks.pop(job_id, None)
            self._encoded.pop(job_id, None)
        return out

    def _content(self, job: JobState, node: str, state: ClusterState) -> dict:
        memo = self._encoded.get(job.job_id)
        if memo is None or memo[0] is not job.spec or memo[1] is not job.workers:
            memo = self._encoded[job.job_id] = (job.spec, job.workers,
                                                _b64(to_proto(job.spec, types_pb2.JobSpecRecord)), {})
        workers = memo[3].get(node)
        if workers is None:
            workers = memo[3][node] = encoded_workers(job, node)
        return job_content(job, node, state, memo[2], workers)


def _node_name(event: ev.NodeRegistered | ev.NodeLost) -> str:
    return event.node.name if isinstance(event, ev.NodeRegistered) else event.node


def nodes_with_work(job: JobState | None) -> set[str]:
    """Nodes with a worker of the job's attempt that holds resources and has not ended."""
    if job is None or not job.phase.holds_gpus:
        return set()
    return {w.node for w in job.workers if w.worker not in job.finished}


def job_content(job: JobState, node: str, state: ClusterState, spec: str | None = None,
                workers: list[str] | None = None) -> dict:
    """The content of ``node``'s record of the job; ``spec`` and ``workers``, when given,
    are their encodings (``ViewBuilder`` keeps them per attempt: they do not change)."""
    if spec is None:
        spec = _b64(to_proto(job.spec, types_pb2.JobSpecRecord))
    if workers is None:
        workers = encoded_workers(job, node)
    addresses = {}
    for w in job.workers:
        peer = state.nodes.get(w.node)
        addresses[w.node] = (peer.info.address if peer is not None else "") or w.node
    doc = {
        "job": job.job_id, "attempt": job.attempt, "phase": job.phase.value,
        "spec": spec, "workers": workers,
        "finished": {str(w): code for w, code in sorted(job.finished.items())},
        "rendezvous": job.rendezvous, "checkpoint": job.checkpoint,
        "checkpoint_progress_s": job.checkpoint_progress_s, "addresses": addresses,
    }
    if job.array_of:   # an array's task: its workers are told the array and their index
        doc["array_of"], doc["array_index"] = job.array_of, job.array_index
    return doc


def encoded_workers(job: JobState, node: str) -> list[str]:
    """Every worker of the attempt, other nodes' without their GPUs."""
    return [_b64(to_proto(w if w.node == node else WorkerAssignment(w.worker, w.node), types_pb2.WorkerAssignment))
            for w in job.workers]


def _b64(message) -> str:
    return base64.b64encode(message.SerializeToString()).decode()


class ViewDecodeError(ValueError):
    """A work-view record that is not one this code writes."""


def decode_value(value: bytes | None) -> dict:
    try:
        doc: Any = json.loads(value or b"")
    except ValueError as exc:
        raise ViewDecodeError(f"not JSON: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("offset"), int):
        raise ViewDecodeError("a work-view record is an object with an integer offset")
    return doc


def decode_record(value: bytes | None, headers=()) -> dict:
    """A record as read: a tombstone is ``{"gone": true}`` at the offset of its header."""
    if value is not None:
        return decode_value(value)
    found = dict(headers or ())
    try:
        return {"gone": True, "offset": int(found[OFFSET_HEADER])}
    except (KeyError, ValueError):
        raise ViewDecodeError(f"a tombstone without an integer {OFFSET_HEADER} header") from None


def job_of(doc: dict) -> JobState:
    """The job as the agent needs it, rebuilt from a ``job:`` record."""
    try:
        spec = from_proto(JobSpec, types_pb2.JobSpecRecord.FromString(base64.b64decode(doc["spec"])))
        workers = tuple(from_proto(WorkerAssignment, types_pb2.WorkerAssignment.FromString(base64.b64decode(w)))
                        for w in doc["workers"])
        return JobState(job_id=doc["job"], spec=spec, seq=0, submitted_at=0.0, phase=JobPhase(doc["phase"]),
                        attempt=int(doc["attempt"]), workers=workers,
                        finished={int(w): int(c) for w, c in doc["finished"].items()},
                        rendezvous=doc["rendezvous"], checkpoint=doc["checkpoint"],
                        checkpoint_progress_s=float(doc["checkpoint_progress_s"]),
                        array_of=str(doc.get("array_of", "")), array_index=int(doc.get("array_index", -1)))
    except (KeyError, TypeError, ValueError) as exc:
        raise ViewDecodeError(f"job record: {exc!r}") from None


class NodeView:
    """One node's view as a reader folds it: the jobs it has work of, and its node record.
    ``apply`` returns whether the record was new (newer offset than the key's last)."""

    def __init__(self) -> None:
        self.state = ClusterState()          # only ``jobs`` is filled: the agent's lookups
        self.addresses: dict[str, dict[str, str]] = {}
        self.node: dict = {}
        self.offsets: dict[str, int] = {}

    def apply(self, key: str, doc: dict) -> bool:
        if doc["offset"] <= self.offsets.get(key, -1):
            return False
        if key == NODE_KEY:
            self.node = doc
        elif key.startswith(JOB_KEY):
            job_id = key[len(JOB_KEY):]
            if doc.get("gone"):
                self.state.jobs.pop(job_id, None)
                self.addresses.pop(job_id, None)
            else:
                self.state.jobs[job_id] = job_of(doc)
                self.addresses[job_id] = dict(doc.get("addresses") or {})
        else:
            raise ViewDecodeError(f"unknown key {key!r}")
        self.offsets[key] = doc["offset"]
        return True
