"""``gpusched decode``: kcat's length-prefixed values to JSON lines; the descriptor set
decodes what the generated code writes. tests/integration/test_observability.py decodes
records read back from the real broker."""
from __future__ import annotations

import io
import json

from click.testing import CliRunner
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from gpusched.adapters.log import codec
from gpusched.cli import cli
from gpusched.core import events as ev
from gpusched.ctl.decode import DESCRIPTOR_SET, framed_values
from gpusched.v1 import events_pb2


def value(job_id: str) -> bytes:
    return codec.encode(ev.JobCancelled(event_id=f"e-{job_id}", job_id=job_id, reason="r"), "default", {})


def kcat(*values: bytes | None) -> bytes:
    """What ``kcat -f '%S\\n%s'`` writes for these values."""
    return b"".join(b"-1\n" if v is None else f"{len(v)}\n".encode() + v for v in values)


def test_values_with_newlines_inside_are_split_by_their_lengths():
    values = [value("j\n1"), None, value("j2")]
    assert list(framed_values(io.BytesIO(kcat(*values)))) == values


def test_decode_writes_one_json_object_per_record():
    result = CliRunner().invoke(cli, ["decode"], input=kcat(value("j1"), None, value("j2")))
    assert result.exit_code == 0, result.output
    first, empty, second = [json.loads(line) for line in result.output.splitlines()]
    assert first["type"] == "JobCancelled" and first["job_cancelled"] == {"job_id": "j1", "reason": "r"}
    assert empty is None and second["job_cancelled"]["job_id"] == "j2"


def test_decode_names_the_record_it_cannot_read():
    result = CliRunner().invoke(cli, ["decode"], input=kcat(value("j1")) + b"12\nshort")
    assert result.exit_code == 1
    assert "record 2: 12 bytes announced, 5 read" in result.output
    result = CliRunner().invoke(cli, ["decode", "--raw"], input=b"\x01\x02")
    assert result.exit_code == 1 and "not a gpusched.v1.EventEnvelope" in result.output
    result = CliRunner().invoke(cli, ["decode"], input=b"hello\n")
    assert result.exit_code == 1 and "expected a length line" in result.output


def test_the_descriptor_set_describes_the_envelope_as_the_generated_code_does():
    result = CliRunner().invoke(cli, ["decode", "--descriptor-set"])
    assert result.output.strip() == str(DESCRIPTOR_SET)
    files = descriptor_pb2.FileDescriptorSet.FromString(DESCRIPTOR_SET.read_bytes())
    pool = descriptor_pool.DescriptorPool()
    for file in files.file:
        pool.Add(file)
    envelope = message_factory.GetMessageClass(pool.FindMessageTypeByName("gpusched.v1.EventEnvelope"))
    decoded = envelope.FromString(value("j1"))
    assert decoded.job_cancelled.job_id == "j1"
    assert decoded.SerializeToString() == events_pb2.EventEnvelope.FromString(value("j1")).SerializeToString()
