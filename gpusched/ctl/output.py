"""Printing: a table (``-o wide`` adds columns), or the API's objects as JSON or YAML."""
from __future__ import annotations

import json
import time
from typing import Callable, Sequence

import click
import yaml
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message
from rich.console import Console
from rich.table import Table
from rich.text import Text

from gpusched.adapters.log.codec import from_proto
from gpusched.client import seconds
from gpusched.core.model import WorkerResources
from gpusched.v1 import types_pb2

Instant = float | Message   # epoch seconds, or the API's google.protobuf.Timestamp (unset: not yet)

FORMATS = ("table", "wide", "json", "yaml")
output_option = click.option("-o", "--output", type=click.Choice(FORMATS), default="table", show_default=True,
                             help="table, a wider table, or the API's objects as JSON or YAML")

# (header, cell) pairs; the wide columns come after the plain ones
Column = tuple[str, Callable[[object], str]]


_INT64 = frozenset({FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT64,
                    FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED64})
_AS_TEXT = ("google.protobuf.",)   # Timestamp, Duration, ...: their JSON form is a string


def as_dict(message: Message) -> dict:
    """An API object as JSON or YAML show it: every field, zero values included (GPU 0,
    worker 0), a field with presence left unset as null, 64-bit integers as numbers
    (proto3's JSON mapping drops zeros and quotes 64-bit integers)."""
    data = MessageToDict(message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    return _every_field(message, data)


def _every_field(message: Message, data: dict) -> dict:
    out = {}
    for field in message.DESCRIPTOR.fields:
        value = data.get(field.name)
        if value is not None:
            value = _field_value(field, getattr(message, field.name), value)
        out[field.name] = value
    return out


def _field_value(field: FieldDescriptor, held, value):
    kind = field.message_type
    if kind is not None and kind.GetOptions().map_entry:   # the API's maps have string keys
        value_field = kind.fields_by_name["value"]
        return {key: _one(value_field, held[key] if value_field.message_type else None, item)
                for key, item in value.items()}
    if field.is_repeated:
        return [_one(field, h, v) for h, v in zip(held, value)]
    return _one(field, held, value)


def _one(field: FieldDescriptor, held, value):
    if field.message_type is not None:
        return value if field.message_type.full_name.startswith(_AS_TEXT) else _every_field(held, value)
    return int(value) if field.type in _INT64 else value


def printable(text: str) -> str:
    """``text`` with what a terminal would act on written out as escapes (``\\x1b``, ``\\n``,
    ``\\u202e``): control characters, C1 codes, DEL, bidirectional overrides and other
    invisible formatting. A job's command, reason or checkpoint, a node's label, comes
    from users and agents: printed raw, an escape sequence in it could move the cursor,
    rewrite the screen or retitle the operator's terminal."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c == " " else c.encode("unicode_escape").decode("ascii") for c in text)


def echo_lines(lines: Sequence[str]) -> None:
    """Lines of text for the terminal, each made ``printable``."""
    click.echo("\n".join(map(printable, lines)))


def dump(data: object, fmt: str) -> None:
    if fmt == "json":
        click.echo(json.dumps(data, indent=2))
    else:
        click.echo(yaml.safe_dump(data, sort_keys=False).rstrip())


def table(items: Sequence[object], columns: Sequence[Column], wide: Sequence[Column] = (),
          fmt: str = "table", objects: Callable[[object], object] = lambda m: as_dict(m)) -> None:
    if fmt in ("json", "yaml"):
        dump([objects(i) for i in items], fmt)
        return
    cols = list(columns) + (list(wide) if fmt == "wide" else [])
    grid = Table(box=None, header_style="bold", pad_edge=False, show_edge=False)
    for header, _ in cols:
        grid.add_column(header, no_wrap=True, overflow="ignore")
    for item in items:   # as text: neither the terminal nor rich's markup acts on what a cell holds
        grid.add_row(*(Text(printable(cell(item))) for _, cell in cols))
    # a pipe or a file gets the whole table, not one cut to a terminal's width
    console = Console(width=400 if not click.get_text_stream("stdout").isatty() else None, soft_wrap=True)
    with console.capture() as captured:
        console.print(grid)
    click.echo("\n".join(line.rstrip() for line in captured.get().rstrip("\n").splitlines()))


def phase_name(phase: int) -> str:
    return types_pb2.JobPhase.Name(phase).removeprefix("JOB_PHASE_").capitalize()


def node_status(status: int) -> str:
    return types_pb2.NodeStatus.Name(status).removeprefix("NODE_STATUS_").capitalize()


def age(t: Instant, now: float | None = None) -> str:
    """kubectl's AGE: 45s, 12m, 3h, 2d."""
    t = t if isinstance(t, (int, float)) else seconds(t)
    if not t:
        return "-"
    s = max(0, int((now or time.time()) - t))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s // size}{unit}"
    return f"{s}s"


def clock(t: Instant) -> str:
    t = t if isinstance(t, (int, float)) else seconds(t)
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "-"


def gpus_of(resources: types_pb2.WorkerResources) -> str:
    """A worker's GPUs as a user wrote them: 2, 0.25 (a share), 3g (a MIG slice)."""
    if resources.mig_profile:
        return resources.mig_profile
    if resources.gpu_milli:
        return f"{resources.gpu_milli / 1000:g}"
    return str(resources.gpus)


def gpu_count(gpus: float) -> str:
    """GPUs to two decimals at most: 24, 0.25, 0.43 (a 3g MIG slice)."""
    return f"{round(gpus, 2):g}"


def milli_of(resources: types_pb2.WorkerResources) -> int:
    """A worker's GPU milli, as the reducer counts a job's usage (``WorkerResources.milli``:
    a MIG slice counts its compute slices in sevenths, a 3g slice 428)."""
    return from_proto(WorkerResources, resources).milli
