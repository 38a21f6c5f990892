"""The pool log's spec keeps the layout every log was written in, while the API's spec
moved to Durations and a preemptible with presence (docs/reference/api-errors.md)."""
from __future__ import annotations

from google.protobuf.descriptor import FieldDescriptor as FD

from gpusched.adapters.log import codec
from gpusched.core import events as ev
from gpusched.core.model import JobSpec
from gpusched.v1 import events_pb2, types_pb2

# The log's JobSpec layout as logs hold it: (number, name, type, has presence).
LOG_LAYOUT = [(1, "name", FD.TYPE_STRING, False), (2, "team", FD.TYPE_STRING, False),
              (3, "pool", FD.TYPE_STRING, False), (4, "priority_class", FD.TYPE_STRING, False),
              (5, "kind", FD.TYPE_ENUM, False), (6, "workers", FD.TYPE_INT32, False),
              (7, "resources", FD.TYPE_MESSAGE, True), (8, "max_runtime_s", FD.TYPE_DOUBLE, False),
              (9, "preemptible", FD.TYPE_BOOL, False), (10, "checkpoint_interval_s", FD.TYPE_DOUBLE, False),
              (11, "command", FD.TYPE_STRING, False), (12, "simulated_duration_s", FD.TYPE_DOUBLE, False),
              (13, "org", FD.TYPE_STRING, False), (14, "max_restarts", FD.TYPE_INT32, True),
              # fields are only added, never changed: older logs decode with their defaults
              (15, "retry", FD.TYPE_MESSAGE, False), (16, "depends_on", FD.TYPE_MESSAGE, False),
              (17, "array", FD.TYPE_MESSAGE, True), (18, "service", FD.TYPE_STRING, False),
              (19, "serve_port", FD.TYPE_BOOL, False), (20, "readiness", FD.TYPE_MESSAGE, True),
              (21, "topology", FD.TYPE_MESSAGE, True)]


def _layout(descriptor) -> list[tuple]:
    return sorted((f.number, f.name, f.type, f.has_presence) for f in descriptor.fields)


def test_the_log_records_a_spec_in_the_layout_logs_were_written_in():
    assert events_pb2.JobSubmitted.DESCRIPTOR.fields_by_name["spec"].message_type is types_pb2.JobSpecRecord.DESCRIPTOR
    assert _layout(types_pb2.JobSpecRecord.DESCRIPTOR) == LOG_LAYOUT


def test_a_non_preemptible_job_in_the_log_stays_non_preemptible():
    """proto3 writes no false bool: an absent field 9 must still read as false."""
    event = ev.JobSubmitted(event_id="e", job_id="j", spec=JobSpec(name="j", team="t", preemptible=False))
    record = events_pb2.EventEnvelope.FromString(codec.encode(event, "p")).job_submitted.spec
    assert 9 not in [f.number for f, _ in record.ListFields()]
    assert codec.decode(codec.encode(event, "p"))[0].spec.preemptible is False


def test_the_api_spec_has_durations_a_preemptible_with_presence_and_no_old_doubles():
    fields = types_pb2.JobSpec.DESCRIPTOR.fields_by_number
    assert not {8, 10, 12} & set(fields)
    assert fields[9].name == "preemptible" and fields[9].has_presence
    assert {fields[n].message_type.full_name for n in (15, 16, 17)} == {"google.protobuf.Duration"}
