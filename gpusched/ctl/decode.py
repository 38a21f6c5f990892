"""``gpusched decode``: records of gpusched's topics, read from stdin, as JSON lines.

A record's value is one protobuf message (docs/reference/consuming-the-log.md): an
``EventEnvelope`` on the pool log and the report topics, a ``DeadLetter``, a
``Heartbeat`` or a ``WorkerUsage`` on the others (the ``gpusched.schema`` header
names it). kcat cannot split binary values by lines, so they are read as kcat writes
them with ``-f '%S\\n%s'``: each value's length in bytes on a line, then the value
(-1 for a record without one, written as JSON ``null``). ``--raw``: stdin is one value.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import BinaryIO, Iterator

import click
from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message

import gpusched.v1
from gpusched.v1 import events_pb2, usage_pb2

MESSAGES: dict[str, type[Message]] = {
    "gpusched.v1.EventEnvelope": events_pb2.EventEnvelope,
    "gpusched.v1.DeadLetter": events_pb2.DeadLetter,
    "gpusched.v1.Heartbeat": events_pb2.Heartbeat,
    "gpusched.v1.WorkerUsage": usage_pb2.WorkerUsage,
}
DESCRIPTOR_SET = Path(gpusched.v1.__file__).with_name("gpusched.desc")


class FramingError(ValueError):
    """Input that is not length-prefixed values."""


def framed_values(stream: BinaryIO) -> Iterator[bytes | None]:
    """The values of ``kcat -f '%S\\n%s'`` output, in order (None: a record without one)."""
    number = 0
    while line := stream.readline():
        number += 1
        try:
            size = int(line)
        except ValueError:
            raise FramingError(f"record {number}: expected a length line (kcat -f '%S\\n%s'), "
                               f"got {line[:40]!r}") from None
        if size < 0:
            yield None
            continue
        value = stream.read(size)
        if len(value) != size:
            raise FramingError(f"record {number}: {size} bytes announced, {len(value)} read")
        yield value


def as_json(value: bytes | None, message: type[Message]) -> str:
    """One record's value as a JSON object (protobuf's JSON mapping, field names as in the
    .proto files); ``null`` for no value."""
    if value is None:
        return "null"
    parsed = message()
    parsed.ParseFromString(value)
    return json.dumps(json_format.MessageToDict(parsed, preserving_proto_field_name=True), sort_keys=True)


@click.command("decode")
@click.option("--type", "type_name", type=click.Choice(sorted(MESSAGES)), default="gpusched.v1.EventEnvelope",
              show_default=True, help="the message in the values (the records' gpusched.schema header)")
@click.option("--raw", is_flag=True, help="stdin is one value, not kcat's length-prefixed values")
@click.option("--descriptor-set", is_flag=True,
              help="print the path of the protobuf descriptor set (for protoc --decode) and stop")
def decode(type_name: str, raw: bool, descriptor_set: bool) -> None:
    """Records of a gpusched topic as JSON, one object a line:
    kcat -C -b BROKER -t PREFIX.cluster-events -e -f '%S\\n%s' | gpusched decode"""
    if descriptor_set:
        if not DESCRIPTOR_SET.exists():
            raise click.ClickException(f"{DESCRIPTOR_SET} is missing: run deploy/setup.sh to build it")
        click.echo(str(DESCRIPTOR_SET))
        return
    message = MESSAGES[type_name]
    stdin = click.get_binary_stream("stdin")
    values = iter([stdin.read()]) if raw else framed_values(stdin)
    count = 0
    try:
        for count, value in enumerate(values, 1):
            click.echo(as_json(value, message))
    except FramingError as exc:
        raise click.ClickException(str(exc)) from None
    except DecodeError:
        raise click.ClickException(f"record {count}: not a {type_name} (wrong --type, or the value is not "
                                   "what kcat -f '%S\\n%s' wrote)") from None
    sys.stdout.flush()
